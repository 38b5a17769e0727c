package colocation

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/shared/toleration"
)

// maxScanTolerations bounds the elements tolerationsHave reads; a longer
// list is read by toleration.Of (ScanList's bound, Read's too).
const maxScanTolerations = toleration.MaxRead

// tolerationsHave returns the tolerations of the list at path in doc that
// equal one of ts (as toleration.Raw.Equal compares them), reading the list's
// bytes without decoding it: a pod's list, a dozen or more once lifespan
// has run, is not decoded to find the one or two a profile adds. The
// profiles need no more of the list: apply only asks whether a toleration
// is in it, and Write appends what is not.
//
// First, when no element's key can be a key of ts (toleration.KeysAbsent:
// the keys' quoted bytes are nowhere in the list), none is equal and
// nothing more is read: the common case, a profile's toleration the pod
// does not have yet. The elements are not checked then, as no field the
// policy does not need is: an element the decoder refuses is not refused
// here (the API server never sends one).
//
// Else ok is false, and the caller reads the whole list with toleration.Of
// as before, unless every element is an object of only the members
// toleration.Read reads itself, each in the form it reads without falling
// back to the decoder (key, operator, value and effect: strings without
// escapes; tolerationSeconds: null or an integer strconv.ParseInt takes):
// then the list decodes, with toleration.Read and with the decoder, to
// exactly the fields compared here, so the answer is the one the decoded
// list gives and no decoding error is missed. err is doc.Get's, as
// toleration.Of returns it; a missing or null list has none.
func tolerationsHave(doc *jsonedit.Doc, path []string, ts []corev1.Toleration) (have []corev1.Toleration, ok bool, err error) {
	raw, err := doc.Get(path...)
	if err != nil {
		return nil, false, err
	}
	if toleration.KeysAbsent(raw, ts) {
		return nil, true, nil
	}
	ok, err = toleration.ScanAt(doc, path, func(e toleration.Raw) {
		for _, t := range ts {
			if e.Equal(t) {
				have = append(have, t)
				break
			}
		}
	})
	if err != nil || !ok {
		return nil, false, err
	}
	return have, true, nil
}
