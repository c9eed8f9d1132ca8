package protocol

import "io"

// ReadMessage reads r to its end into b, appending, up to limit bytes: a
// message longer than limit comes back limit bytes long, for the caller to
// refuse. It is io.ReadAll into a buffer the caller keeps from frame to
// frame, which Decode allows: no frame refers to the bytes it came from.
func ReadMessage(r io.Reader, b []byte, limit int64) ([]byte, error) {
	for int64(len(b)) < limit {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		window := b[len(b):cap(b)]
		if rest := limit - int64(len(b)); int64(len(window)) > rest {
			window = window[:rest]
		}
		n, err := r.Read(window)
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
	return b, nil
}

// MaxKeptBuffer bounds a buffer kept from one frame to the next (for
// ReadMessage, or for encoding): a rare large frame's is let go rather than
// held for as long as its connection.
const MaxKeptBuffer = 64 << 10

// KeepBuffer returns b to keep for the next frame, or nil when it is larger
// than MaxKeptBuffer.
func KeepBuffer(b []byte) []byte {
	if cap(b) > MaxKeptBuffer {
		return nil
	}
	return b
}
