package quotapb

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
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
