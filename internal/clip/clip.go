// Package clip quotes outside bytes (a request or message body, a header a
// client sent) for a log line or a header of ours: at most Max bytes of them,
// Go-quoted, so that a client can neither fill the logs nor forge a line or
// a header with its own newlines.
package clip

import "strconv"

// Max is the most bytes of outside input quoted.
const Max = 256

// Quote is b's first Max bytes, Go-quoted (control bytes and invalid UTF-8
// escaped), with the length left out named after it.
func Quote[T string | []byte](b T) string {
	q, rest := quote(b)
	return q + rest
}

// Text is Quote without the surrounding quotes: for a header value, or a
// field a log handler quotes itself.
func Text[T string | []byte](b T) string {
	q, rest := quote(b)
	return q[1:len(q)-1] + rest
}

func quote[T string | []byte](b T) (q, rest string) {
	if len(b) <= Max {
		return strconv.Quote(string(b)), ""
	}
	return strconv.Quote(string(b[:Max])), "…(" + strconv.Itoa(len(b)-Max) + " more bytes)"
}
