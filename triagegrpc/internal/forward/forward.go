// Package forward holds what forwarding a gRPC call without knowing its
// message types takes, shared by the batch proxy and the load target of
// package triagegrpc: messages carried as their wire bytes (Frame, Codec),
// the call option that marks outgoing metadata already cleaned of triage
// keys (Clean).
package forward

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// Frame is one message, as its wire bytes.
type Frame struct{ B []byte }

// Codec passes Frames through untouched and hands every other message to
// the proto codec; its name is "proto", what clients send.
type Codec struct{ proto encoding.CodecV2 }

// NewCodec returns a Codec over grpc-go's registered proto codec.
func NewCodec() Codec { return Codec{proto: encoding.GetCodecV2("proto")} }

func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*Frame); ok {
		return mem.BufferSlice{mem.SliceBuffer(f.B)}, nil
	}
	return c.proto.Marshal(v)
}

func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*Frame); ok {
		f.B = data.Materialize()
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

func (Codec) Name() string { return "proto" }

// Clean is the call option of calls whose outgoing metadata the caller
// built without triage keys: triagegrpc's Client then skips copying it to
// drop them.
type Clean struct{ grpc.EmptyCallOption }
