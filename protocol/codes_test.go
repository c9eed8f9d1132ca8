package protocol

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCloseCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		close CloseCode
		value int
		code  ErrorCode
	}{
		{CloseGoingAway, 1001, CodeGoingAway},
		{CloseMalformed, 4400, CodeMalformed},
		{CloseUnauthorized, 4401, CodeUnauthorized},
		{CloseForbidden, 4403, CodeForbidden},
		{CloseTimeout, 4408, CodeTimeout},
		{CloseReplaced, 4409, CodeReplaced},
		{CloseTooLarge, 4413, CodeTooLarge},
		{CloseRateLimited, 4429, CodeRateLimited},
	}
	for _, tc := range tests {
		require.Equal(t, tc.value, int(tc.close))
		require.Equal(t, tc.code, tc.close.ErrorCode())
		require.NotEmpty(t, tc.close.Reason())
		require.LessOrEqual(t, len(tc.close.Reason()), 123, "a WebSocket close reason is at most 123 bytes")
	}
	require.Empty(t, CloseCode(1000).ErrorCode())
	require.Empty(t, CloseCode(4999).Reason())

	// The codes DESIGN fixes by name.
	require.Equal(t, ErrorCode("unknown_type"), CodeUnknownType)
	require.Equal(t, ErrorCode("unknown_command"), CodeUnknownCommand)
	require.Equal(t, ErrorCode("duplicate_terminal"), CodeDuplicateTerminal)
	require.Equal(t, 1, ProtocolVersion)
}

func TestCloseCodeFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		frame string
		code  CloseCode
		close bool
	}{
		{`{"type":"ping"}`, 0, false},
		{`{"type":"subscribe"}`, 0, false},
		{`{"type":"ping"`, CloseMalformed, true},
		{`{"type":"ack"}`, CloseMalformed, true},
		{`{"type":"hello","protocol":1,"client_id":"c","client_type":"browser"}`, CloseUnauthorized, true},
		{`{"type":"hello","protocol":1,"token":"","client_id":"c","client_type":"browser"}`, CloseUnauthorized, true},
		{`{"type":"hello","protocol":1,"token":7,"client_id":"c","client_type":"browser"}`, CloseUnauthorized, true},
		{`{"type":"hello","protocol":2,"token":"k","client_id":"c","client_type":"browser"}`, CloseMalformed, true},
	}
	for _, tc := range tests {
		_, err := Decode([]byte(tc.frame))
		code, ok := CloseCodeFor(err)
		require.Equal(t, tc.close, ok, tc.frame)
		require.Equal(t, tc.code, code, tc.frame)
	}

	// Wrapped errors are recognised too.
	_, err := Decode([]byte(`{"type":"nope"}`))
	_, ok := CloseCodeFor(fmt.Errorf("reading frame: %w", err))
	require.False(t, ok)
	code, ok := CloseCodeFor(errors.New("some other failure"))
	require.True(t, ok)
	require.Equal(t, CloseMalformed, code)
}
