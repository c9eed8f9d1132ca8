// Package protocol defines version 1 of the wire protocol between the Cheetah
// broker and its clients (browser extensions and console agents): the frame
// types, their validation, and their JSON encoding. It does no I/O, so the
// broker, the agent library and tests share one definition of what a valid
// frame is.
//
// A client holds one WebSocket to the broker and exchanges JSON text frames,
// one object per frame, each with a "type". The client opens with hello,
// which carries its token because browsers cannot set headers on a
// WebSocket; the broker answers welcome. From then on the client reports its
// contexts with state (always the full list), and answers each command with
// ack, progress, event, capture and finally one terminal message, result or
// error. The broker sends command, cancel and assignment frames. Either side
// may ping; the other answers pong.
//
// Decode is strict where strictness protects the broker and lenient where
// leniency lets the protocol grow. A missing or mistyped field of a known
// frame is a *MalformedError that names the field, and the broker closes the
// connection with the matching close code (see CloseCodeFor). An unknown
// field is ignored and an unknown type is an *UnknownTypeError, which the
// broker answers with an unknown_type error frame while the connection stays
// open, so that newer clients can talk to older brokers.
//
// The caller's data (params, target, options, and the data of progress,
// event, result and error) is opaque to the broker. It is held as
// json.RawMessage and Encode writes it byte for byte, so what an application
// sends is exactly what the client receives, and what a client reports is
// exactly what history stores.
package protocol
