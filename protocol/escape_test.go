package protocol

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// escapeCases are strings whose JSON escaping matters: every control
// character, NUL, HTML characters, line and paragraph separators, invalid
// UTF-8 alone, at the ends and cut in the middle of a character.
var escapeCases = []string{
	"", "plain", "\x00", "a\x00b", "\"quoted\" \\back\\", "\b\f\n\r\t\x01\x1f\x7f",
	"<script>&amp;</script>", "\u2028\u2029", "é中🙂", "\xff", "a\xffb", "\xc3", "\xe4\xb8",
	"\xf0\x9f\x99", "\xed\xa0\x80", "\xc0\xaf", "x\u2028y\xfe\xfe\u00e9",
}

// TestAppendStringMatchesEncodingJSON pins the hand-written escaping to
// what encoding/json wrote before it, byte for byte.
func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	all := ""
	for b := range 256 {
		all += string(rune(b)) + string([]byte{byte(b)})
	}
	for _, s := range append(escapeCases, all) {
		want, err := json.Marshal(s)
		require.NoError(t, err)
		require.Equal(t, string(want), string(appendString(nil, s)), "%q", s)
	}
}

// TestLabelsMatchEncodingJSON pins label maps: keys sorted, escaped alike.
func TestLabelsMatchEncodingJSON(t *testing.T) {
	t.Parallel()
	m := map[string]string{}
	for i, s := range escapeCases {
		m[s+string(rune('a'+i))] = s
	}
	want, err := json.Marshal(m)
	require.NoError(t, err)
	w := writer{}
	w.labels("l", m)
	require.Equal(t, `"l":`+string(want), string(w.buf))
}

func FuzzAppendString(f *testing.F) {
	for _, s := range escapeCases {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		require.NoError(t, err)
		got := appendString([]byte("prefix"), s)
		require.Equal(t, "prefix"+string(want), string(got))
		require.True(t, json.Valid(got[len("prefix"):]))
	})
}
