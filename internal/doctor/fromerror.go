package doctor

// ErrorMatch is what --from-error found in the API server's message.
type ErrorMatch struct {
	Webhook string `json:"webhook"`
}
