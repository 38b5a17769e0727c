package main

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	cfg, _ := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	switch os.Args[1] {
	case "ns":
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: os.Args[2]}}, metav1.CreateOptions{})
		fmt.Println(err)
	case "pod":
		_, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: os.Args[2]}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}, metav1.CreateOptions{DryRun: []string{"All"}})
		fmt.Println(err)
	case "load":
		fails := 0
		for i := 0; i < 400; i++ {
			_, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("load-%d", i)}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}, metav1.CreateOptions{DryRun: []string{"All"}})
			if err != nil {
				fails++
				fmt.Println(time.Now().Format("15:04:05.000"), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		fmt.Println("failures:", fails)
	case "secret":
		s, err := cs.CoreV1().Secrets("kadmit-system").Get(ctx, "kadmit-tls", metav1.GetOptions{})
		if err == nil { fmt.Println(s.ResourceVersion, len(s.Data), s.Annotations) } else { fmt.Println(err) }
	case "rotate":
		s, _ := cs.CoreV1().Secrets("kadmit-system").Get(ctx, "kadmit-tls", metav1.GetOptions{})
		if s.Annotations == nil { s.Annotations = map[string]string{} }
		s.Annotations["kadmit.io/rotate"] = os.Args[2]
		_, err := cs.CoreV1().Secrets("kadmit-system").Update(ctx, s, metav1.UpdateOptions{})
		fmt.Println(err)
	case "delsecret":
		fmt.Println(cs.CoreV1().Secrets("kadmit-system").Delete(ctx, "kadmit-tls", metav1.DeleteOptions{}))
	case "bundles":
		v, _ := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
		for _, w := range v.Webhooks {
			fmt.Println(w.Name, len(w.ClientConfig.CABundle))
		}
	case "blank":
		v, _ := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
		for i := range v.Webhooks { v.Webhooks[i].ClientConfig.CABundle = nil }
		_, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, v, metav1.UpdateOptions{})
		fmt.Println(err)
	}
}
