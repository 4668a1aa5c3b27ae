package quotapb

import (
	"context"
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/emptypb"
)

// RefreshRequest: a task's report (quota.proto).
type RefreshRequest struct {
	Task      string           // 1
	Customers []*CustomerUsage // 2
	NoLease   bool             // 3
}

// CustomerUsage: one customer's usage on a task.
type CustomerUsage struct {
	Customer string    // 1
	Used     []float64 // 2, packed
	Demand   float64   // 3
	Share    float64   // 4
}

// RefreshResponse: a task's lease.
type RefreshResponse struct {
	Grants    []*Grant // 1
	Default   *Grant   // 2
	LeaseMs   int64    // 3
	RefreshMs int64    // 4
	Fallback  string   // 5
	Tasks     int32    // 6
	Partial   bool     // 7
}

// Grant: one customer's limit and the task's share of it.
type Grant struct {
	Customer      string    // 1
	Cpu           float64   // 2
	ByCriticality []float64 // 3, packed
	Hard          bool      // 4
	Share         float64   // 5
}

// Getters, nil-safe as protobuf's.

func (r *RefreshRequest) GetTask() string {
	if r == nil {
		return ""
	}
	return r.Task
}

func (r *RefreshRequest) GetNoLease() bool {
	if r == nil {
		return false
	}
	return r.NoLease
}

func (r *RefreshRequest) GetCustomers() []*CustomerUsage {
	if r == nil {
		return nil
	}
	return r.Customers
}

func (c *CustomerUsage) GetCustomer() string {
	if c == nil {
		return ""
	}
	return c.Customer
}

func (c *CustomerUsage) GetUsed() []float64 {
	if c == nil {
		return nil
	}
	return c.Used
}

func (c *CustomerUsage) GetDemand() float64 {
	if c == nil {
		return 0
	}
	return c.Demand
}

func (c *CustomerUsage) GetShare() float64 {
	if c == nil {
		return 0
	}
	return c.Share
}

func (r *RefreshResponse) GetGrants() []*Grant {
	if r == nil {
		return nil
	}
	return r.Grants
}

func (r *RefreshResponse) GetDefault() *Grant {
	if r == nil {
		return nil
	}
	return r.Default
}

func (r *RefreshResponse) GetLeaseMs() int64 {
	if r == nil {
		return 0
	}
	return r.LeaseMs
}

func (r *RefreshResponse) GetRefreshMs() int64 {
	if r == nil {
		return 0
	}
	return r.RefreshMs
}

func (r *RefreshResponse) GetFallback() string {
	if r == nil {
		return ""
	}
	return r.Fallback
}

func (r *RefreshResponse) GetPartial() bool {
	if r == nil {
		return false
	}
	return r.Partial
}

func (r *RefreshResponse) GetTasks() int32 {
	if r == nil {
		return 0
	}
	return r.Tasks
}

func (g *Grant) GetCustomer() string {
	if g == nil {
		return ""
	}
	return g.Customer
}

func (g *Grant) GetCpu() float64 {
	if g == nil {
		return 0
	}
	return g.Cpu
}

func (g *Grant) GetByCriticality() []float64 {
	if g == nil {
		return nil
	}
	return g.ByCriticality
}

func (g *Grant) GetHard() bool {
	if g == nil {
		return false
	}
	return g.Hard
}

func (g *Grant) GetShare() float64 {
	if g == nil {
		return 0
	}
	return g.Share
}

// Encoding. Fields at their zero value are not written (proto3).

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendDouble(b []byte, num protowire.Number, v float64) []byte {
	if v == 0 && !math.Signbit(v) {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, math.Float64bits(v))
}

func appendPacked(b []byte, num protowire.Number, vs []float64) []byte {
	if len(vs) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(8*len(vs)))
	for _, v := range vs {
		b = protowire.AppendFixed64(b, math.Float64bits(v))
	}
	return b
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendMessage(b []byte, num protowire.Number, m []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

// Marshal returns r in protobuf's wire format.
func (r *RefreshRequest) Marshal() []byte {
	var b []byte
	b = appendString(b, 1, r.GetTask())
	for _, c := range r.GetCustomers() {
		b = appendMessage(b, 2, c.Marshal())
	}
	if r.GetNoLease() {
		b = appendVarint(b, 3, 1)
	}
	return b
}

// Marshal returns c in protobuf's wire format.
func (c *CustomerUsage) Marshal() []byte {
	var b []byte
	b = appendString(b, 1, c.GetCustomer())
	b = appendPacked(b, 2, c.GetUsed())
	b = appendDouble(b, 3, c.GetDemand())
	b = appendDouble(b, 4, c.GetShare())
	return b
}

// Marshal returns r in protobuf's wire format.
func (r *RefreshResponse) Marshal() []byte {
	var b []byte
	for _, g := range r.GetGrants() {
		b = appendMessage(b, 1, g.Marshal())
	}
	if r.GetDefault() != nil {
		b = appendMessage(b, 2, r.Default.Marshal())
	}
	b = appendVarint(b, 3, uint64(r.GetLeaseMs()))
	b = appendVarint(b, 4, uint64(r.GetRefreshMs()))
	b = appendString(b, 5, r.GetFallback())
	b = appendVarint(b, 6, uint64(int64(r.GetTasks()))) // int32: sign-extended, as protobuf
	if r.GetPartial() {
		b = appendVarint(b, 7, 1)
	}
	return b
}

// Marshal returns g in protobuf's wire format.
func (g *Grant) Marshal() []byte {
	var b []byte
	b = appendString(b, 1, g.GetCustomer())
	b = appendDouble(b, 2, g.GetCpu())
	b = appendPacked(b, 3, g.GetByCriticality())
	if g.GetHard() {
		b = appendVarint(b, 4, 1)
	}
	b = appendDouble(b, 5, g.GetShare())
	return b
}

// Decoding.

var errWire = errors.New("quotapb: malformed wire data")

// Decoding bounds: a message with more entries is refused as it is
// decoded, before the excess is allocated, so that a message's memory
// stays within a small multiple of its wire size.
const (
	// MaxEntries bounds the customers of a RefreshRequest and the grants
	// of a RefreshResponse: what a task can track (quota.MaxCustomers),
	// plus quota.Other.
	MaxEntries = 10001
	// MaxValues bounds a repeated double: one value per criticality.
	MaxValues = 4
)

// field is one decoded field: its number and type, and its value (v for
// varint and fixed64, raw for length-delimited).
type field struct {
	num protowire.Number
	typ protowire.Type
	v   uint64
	raw []byte
}

// fields calls f for each field of b.
func fields(b []byte, f func(field) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return errWire
		}
		b = b[n:]
		fd := field{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			fd.v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed64Type:
			fd.v, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			fd.raw, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errWire
		}
		b = b[n:]
		if err := f(fd); err != nil {
			return err
		}
	}
	return nil
}

func (fd field) str() (string, error) {
	if !utf8.Valid(fd.raw) {
		return "", fmt.Errorf("quotapb: field %d: invalid UTF-8", fd.num)
	}
	return string(fd.raw), nil
}

// doubles appends a repeated double field, packed or not, of at most
// MaxValues values in all.
func (fd field) doubles(to []float64) ([]float64, error) {
	switch fd.typ {
	case protowire.Fixed64Type:
		if len(to) >= MaxValues {
			return nil, errTooMany(fd.num, MaxValues)
		}
		return append(to, math.Float64frombits(fd.v)), nil
	case protowire.BytesType:
		if len(fd.raw)%8 != 0 {
			return nil, errWire
		}
		if len(to)+len(fd.raw)/8 > MaxValues {
			return nil, errTooMany(fd.num, MaxValues)
		}
		for b := fd.raw; len(b) > 0; b = b[8:] {
			v, _ := protowire.ConsumeFixed64(b)
			to = append(to, math.Float64frombits(v))
		}
		return to, nil
	}
	return to, nil // another wire type: an unknown field
}

func (fd field) double() float64 { return math.Float64frombits(fd.v) }

func errTooMany(num protowire.Number, n int) error {
	return fmt.Errorf("quotapb: field %d: more than %d entries", num, n)
}

// Unmarshal decodes b into r, replacing its contents.
func (r *RefreshRequest) Unmarshal(b []byte) error {
	*r = RefreshRequest{}
	return fields(b, func(fd field) (err error) {
		switch {
		case fd.num == 1 && fd.typ == protowire.BytesType:
			r.Task, err = fd.str()
		case fd.num == 2 && fd.typ == protowire.BytesType:
			if len(r.Customers) >= MaxEntries {
				return errTooMany(fd.num, MaxEntries)
			}
			c := new(CustomerUsage)
			if err = c.Unmarshal(fd.raw); err == nil {
				r.Customers = append(r.Customers, c)
			}
		case fd.num == 3 && fd.typ == protowire.VarintType:
			r.NoLease = fd.v != 0
		}
		return err
	})
}

// Unmarshal decodes b into c, replacing its contents.
func (c *CustomerUsage) Unmarshal(b []byte) error {
	*c = CustomerUsage{}
	return fields(b, func(fd field) (err error) {
		switch {
		case fd.num == 1 && fd.typ == protowire.BytesType:
			c.Customer, err = fd.str()
		case fd.num == 2:
			c.Used, err = fd.doubles(c.Used)
		case fd.num == 3 && fd.typ == protowire.Fixed64Type:
			c.Demand = fd.double()
		case fd.num == 4 && fd.typ == protowire.Fixed64Type:
			c.Share = fd.double()
		}
		return err
	})
}

// Unmarshal decodes b into r, replacing its contents.
func (r *RefreshResponse) Unmarshal(b []byte) error {
	*r = RefreshResponse{}
	return fields(b, func(fd field) (err error) {
		switch {
		case fd.num == 1 && fd.typ == protowire.BytesType:
			if len(r.Grants) >= MaxEntries {
				return errTooMany(fd.num, MaxEntries)
			}
			g := new(Grant)
			if err = g.Unmarshal(fd.raw); err == nil {
				r.Grants = append(r.Grants, g)
			}
		case fd.num == 2 && fd.typ == protowire.BytesType:
			g := new(Grant)
			if r.Default != nil {
				*g = *r.Default // a repeated message field merges
			}
			err = g.merge(fd.raw)
			r.Default = g
		case fd.num == 3 && fd.typ == protowire.VarintType:
			r.LeaseMs = int64(fd.v)
		case fd.num == 4 && fd.typ == protowire.VarintType:
			r.RefreshMs = int64(fd.v)
		case fd.num == 5 && fd.typ == protowire.BytesType:
			r.Fallback, err = fd.str()
		case fd.num == 6 && fd.typ == protowire.VarintType:
			r.Tasks = int32(fd.v)
		case fd.num == 7 && fd.typ == protowire.VarintType:
			r.Partial = fd.v != 0
		}
		return err
	})
}

// Unmarshal decodes b into g, replacing its contents.
func (g *Grant) Unmarshal(b []byte) error {
	*g = Grant{}
	return g.merge(b)
}

func (g *Grant) merge(b []byte) error {
	return fields(b, func(fd field) (err error) {
		switch {
		case fd.num == 1 && fd.typ == protowire.BytesType:
			g.Customer, err = fd.str()
		case fd.num == 2 && fd.typ == protowire.Fixed64Type:
			g.Cpu = fd.double()
		case fd.num == 3:
			g.ByCriticality, err = fd.doubles(g.ByCriticality)
		case fd.num == 4 && fd.typ == protowire.VarintType:
			g.Hard = fd.v != 0
		case fd.num == 5 && fd.typ == protowire.Fixed64Type:
			g.Share = fd.double()
		}
		return err
	})
}

// Codec is gRPC's codec for these messages; any other message goes to
// gRPC's registered "proto" codec, so a server with ServerOption also
// serves protoc-generated services. Its name is "proto": the wire format
// is protobuf's.
type Codec struct{}

type wireMessage interface {
	Marshal() []byte
	Unmarshal([]byte) error
}

// Name implements encoding.CodecV2.
func (Codec) Name() string { return "proto" }

// Marshal implements encoding.CodecV2.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(wireMessage); ok {
		return mem.BufferSlice{mem.SliceBuffer(m.Marshal())}, nil
	}
	if c := encoding.GetCodecV2("proto"); c != nil {
		return c.Marshal(v)
	}
	return nil, fmt.Errorf("quotapb: cannot marshal %T", v)
}

// Unmarshal implements encoding.CodecV2.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(wireMessage); ok {
		return m.Unmarshal(data.Materialize())
	}
	if c := encoding.GetCodecV2("proto"); c != nil {
		return c.Unmarshal(data, v)
	}
	return fmt.Errorf("quotapb: cannot unmarshal %T", v)
}

// ServerOption gives a grpc.Server the Codec.
//
// Deprecated: no server needs it any
// more (RegisterQuotaServer's handler decodes the messages itself, under
// whichever codec the server has); it is kept for existing callers.
func ServerOption() grpc.ServerOption { return grpc.ForceServerCodecV2(Codec{}) }

// The service.

// ServiceName and RefreshMethod name the service as quota.proto does.
const (
	ServiceName   = "triage.quota.v1.Quota"
	RefreshMethod = "/" + ServiceName + "/Refresh"
)

// QuotaServer is the server side of the service.
type QuotaServer interface {
	// Refresh reports a task's usage and returns its lease.
	Refresh(context.Context, *RefreshRequest) (*RefreshResponse, error)
}

// UnimplementedQuotaServer answers UNIMPLEMENTED; embed it for forward
// compatibility.
type UnimplementedQuotaServer struct{}

// Refresh implements QuotaServer.
func (UnimplementedQuotaServer) Refresh(context.Context, *RefreshRequest) (*RefreshResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Refresh not implemented")
}

// RegisterQuotaServer registers srv on s, any grpc.Server: the messages
// reach the server's codec (gRPC's "proto" codec, or Codec) as protobuf
// messages whose fields are all unknown, and are decoded here, so no
// server option is needed. Interceptors see *RefreshRequest and
// *RefreshResponse.
func RegisterQuotaServer(s grpc.ServiceRegistrar, srv QuotaServer) {
	s.RegisterService(&serviceDesc, srv)
}

// carry is what the server's codec reads and writes: a message with no
// fields, whose unknown fields are the wire bytes of ours.
func carry(m wireMessage) *emptypb.Empty {
	e := new(emptypb.Empty)
	e.ProtoReflect().SetUnknown(m.Marshal())
	return e
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*QuotaServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Refresh",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			raw := new(emptypb.Empty)
			if err := dec(raw); err != nil {
				return nil, err
			}
			in := new(RefreshRequest)
			if err := in.Unmarshal(raw.ProtoReflect().GetUnknown()); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "quotapb: %v", err)
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(QuotaServer).Refresh(ctx, req.(*RefreshRequest))
			}
			var out any
			var err error
			if interceptor == nil {
				out, err = h(ctx, in)
			} else {
				out, err = interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: RefreshMethod}, h)
			}
			if m, ok := out.(wireMessage); ok && err == nil {
				return carry(m), nil
			}
			return out, err
		},
	}},
	Metadata: "quota.proto",
}

// QuotaClient is the client side of the service.
type QuotaClient interface {
	Refresh(ctx context.Context, in *RefreshRequest, opts ...grpc.CallOption) (*RefreshResponse, error)
}

type quotaClient struct{ cc grpc.ClientConnInterface }

// NewQuotaClient returns a client over cc; every call uses the Codec.
func NewQuotaClient(cc grpc.ClientConnInterface) QuotaClient { return quotaClient{cc} }

func (c quotaClient) Refresh(ctx context.Context, in *RefreshRequest, opts ...grpc.CallOption) (*RefreshResponse, error) {
	out := new(RefreshResponse)
	opts = append([]grpc.CallOption{grpc.ForceCodecV2(Codec{})}, opts...)
	if err := c.cc.Invoke(ctx, RefreshMethod, in, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}
