package quotapb

import (
	"bytes"
	"math"
	"reflect"
	"runtime"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// schema builds quota.proto's descriptors with the protobuf runtime (in a
// local registry, nothing global), to check the hand-written encoding
// against protobuf's own.
func schema(t testing.TB) (req, resp protoreflect.MessageDescriptor) {
	t.Helper()
	str, dbl, i64, i32, boolean, msg := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), descriptorpb.FieldDescriptorProto_TYPE_DOUBLE.Enum(),
		descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum(), descriptorpb.FieldDescriptorProto_TYPE_INT32.Enum(),
		descriptorpb.FieldDescriptorProto_TYPE_BOOL.Enum(), descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum()
	opt, rep := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
	f := func(name string, num int32, typ *descriptorpb.FieldDescriptorProto_Type, label *descriptorpb.FieldDescriptorProto_Label, typeName string) *descriptorpb.FieldDescriptorProto {
		fd := &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(num), Type: typ, Label: label, JsonName: proto.String(name)}
		if typeName != "" {
			fd.TypeName = proto.String(".triage.quota.v1." + typeName)
		}
		return fd
	}
	file := &descriptorpb.FileDescriptorProto{
		Name: proto.String("quota.proto"), Package: proto.String("triage.quota.v1"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("RefreshRequest"), Field: []*descriptorpb.FieldDescriptorProto{
				f("task", 1, str, opt, ""), f("customers", 2, msg, rep, "CustomerUsage"), f("no_lease", 3, boolean, opt, "")}},
			{Name: proto.String("CustomerUsage"), Field: []*descriptorpb.FieldDescriptorProto{
				f("customer", 1, str, opt, ""), f("used", 2, dbl, rep, ""), f("demand", 3, dbl, opt, ""), f("share", 4, dbl, opt, "")}},
			{Name: proto.String("RefreshResponse"), Field: []*descriptorpb.FieldDescriptorProto{
				f("grants", 1, msg, rep, "Grant"), f("default", 2, msg, opt, "Grant"), f("lease_ms", 3, i64, opt, ""),
				f("refresh_ms", 4, i64, opt, ""), f("fallback", 5, str, opt, ""), f("tasks", 6, i32, opt, ""),
				f("partial", 7, boolean, opt, "")}},
			{Name: proto.String("Grant"), Field: []*descriptorpb.FieldDescriptorProto{
				f("customer", 1, str, opt, ""), f("cpu", 2, dbl, opt, ""), f("by_criticality", 3, dbl, rep, ""),
				f("hard", 4, boolean, opt, ""), f("share", 5, dbl, opt, "")}},
		},
	}
	fd, err := protodesc.NewFile(file, new(protoregistry.Files))
	if err != nil {
		t.Fatal(err)
	}
	return fd.Messages().ByName("RefreshRequest"), fd.Messages().ByName("RefreshResponse")
}

var (
	sampleRequest = &RefreshRequest{Task: "task-1", NoLease: true, Customers: []*CustomerUsage{
		{Customer: "gmail", Used: []float64{0, 0.25, 1.5, 0}, Demand: 2, Share: 0.5},
		{Customer: "(other)", Used: []float64{math.Inf(1)}, Demand: math.NaN()},
		{},
	}}
	sampleResponse = &RefreshResponse{
		Grants:  []*Grant{{Customer: "gmail", Cpu: 4000, ByCriticality: []float64{500, 0, 0, 0}, Hard: true, Share: 0.33}, {Customer: "x"}},
		Default: &Grant{Cpu: 0.5, Share: 1}, LeaseMs: 30000, RefreshMs: 5000, Fallback: "safe", Tasks: -3, Partial: true,
	}
)

// Our bytes decode in protobuf's runtime to the same message, and
// protobuf's bytes decode in ours to the same message.
func TestWireMatchesProtobuf(t *testing.T) {
	reqDesc, respDesc := schema(t)
	for _, tc := range []struct {
		ours interface {
			Marshal() []byte
		}
		desc  protoreflect.MessageDescriptor
		fresh func() wireMessage
	}{
		{sampleRequest, reqDesc, func() wireMessage { return new(RefreshRequest) }},
		{sampleResponse, respDesc, func() wireMessage { return new(RefreshResponse) }},
	} {
		dyn := dynamicpb.NewMessage(tc.desc)
		if err := proto.Unmarshal(tc.ours.Marshal(), dyn); err != nil {
			t.Fatalf("protobuf cannot read ours: %v", err)
		}
		theirs, err := proto.MarshalOptions{Deterministic: true}.Marshal(dyn)
		if err != nil {
			t.Fatal(err)
		}
		back := tc.fresh()
		if err := back.Unmarshal(theirs); err != nil {
			t.Fatalf("we cannot read protobuf's: %v", err)
		}
		if !equalNaN(back, tc.ours) {
			t.Errorf("round trip through protobuf:\n got %+v\nwant %+v", back, tc.ours)
		}
		if string(back.Marshal()) != string(theirs) {
			t.Errorf("our bytes differ from protobuf's for the same message")
		}
	}
}

// equalNaN compares messages, NaN equal to NaN.
func equalNaN(a, b any) bool {
	return reflect.DeepEqual(normalise(a), normalise(b))
}

func normalise(v any) any {
	switch m := v.(type) {
	case *RefreshRequest:
		c := &RefreshRequest{Task: m.Task, NoLease: m.NoLease}
		for _, cu := range m.Customers {
			x := *cu
			x.Used = nanFree(x.Used)
			x.Demand, x.Share = nanFree([]float64{x.Demand})[0], nanFree([]float64{x.Share})[0]
			c.Customers = append(c.Customers, &x)
		}
		return c
	}
	return v
}

func nanFree(vs []float64) []float64 {
	var out []float64
	for _, v := range vs {
		if math.IsNaN(v) {
			v = -12345
		}
		out = append(out, v)
	}
	return out
}

// FuzzRefreshRequestWire decodes arbitrary bytes with ours and with
// protobuf's runtime: both accept or both refuse, and what ours decodes
// encodes back to what protobuf encodes.
func FuzzRefreshRequestWire(f *testing.F) {
	f.Add(sampleRequest.Marshal())
	f.Add(sampleResponse.Marshal())
	f.Add([]byte{})
	f.Add([]byte("\x0a\x02\xff\xfe"))             // invalid UTF-8
	f.Add([]byte("\x12\x05\x12\x03\x00\x00\x00")) // packed doubles of 3 bytes
	f.Add([]byte("\x12\x09\x11\x00\x00\x00\x00\x00\x00\xf0\x3f"))
	reqDesc, _ := schema(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var ours RefreshRequest
		errOurs := ours.Unmarshal(b)
		dyn := dynamicpb.NewMessage(reqDesc)
		errTheirs := proto.Unmarshal(b, dyn)
		if errOurs != nil && errTheirs == nil && overBounds(dyn) {
			return // ours refuses what exceeds its decoding bounds
		}
		if (errOurs == nil) != (errTheirs == nil) {
			t.Fatalf("ours: %v, protobuf: %v", errOurs, errTheirs)
		}
		if errOurs != nil {
			return
		}
		dyn2 := dynamicpb.NewMessage(reqDesc)
		if err := proto.Unmarshal(ours.Marshal(), dyn2); err != nil {
			t.Fatal(err)
		}
		clearUnknown(dyn) // ours skips unknown fields
		if !proto.Equal(dyn, dyn2) && !hasNaN(&ours) {
			t.Fatalf("ours decoded %+v, which is not what protobuf decoded", ours)
		}
	})
}

// overBounds reports whether a request protobuf decoded has more than
// MaxEntries customers or more than MaxValues usage values in one.
func overBounds(m protoreflect.Message) bool {
	cs := m.Get(m.Descriptor().Fields().ByName("customers")).List()
	if cs.Len() > MaxEntries {
		return true
	}
	for i := 0; i < cs.Len(); i++ {
		c := cs.Get(i).Message()
		if c.Get(c.Descriptor().Fields().ByName("used")).List().Len() > MaxValues {
			return true
		}
	}
	return false
}

// A message of many small entries is refused as it is decoded, before
// the entries past the bound are allocated: decoding 4 MiB of empty
// customers (two million of them) allocates less than the message's own
// size, where decoding first and counting after allocated some 40 times
// it (issue 21, item 4). Five usage values in one customer are refused
// too.
func TestDecodingIsBounded(t *testing.T) {
	b := bytes.Repeat([]byte{0x12, 0x00}, 2<<20)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var r RefreshRequest
	err := r.Unmarshal(b)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatalf("%d customers decoded", len(r.Customers))
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > uint64(len(b)) {
		t.Errorf("decoding %d bytes allocated %d bytes", len(b), n)
	}
	ok := (&RefreshRequest{Customers: make([]*CustomerUsage, MaxEntries)}).Marshal()
	if err := r.Unmarshal(ok); err != nil || len(r.Customers) != MaxEntries {
		t.Errorf("%d customers: %v", MaxEntries, err)
	}
	five := (&RefreshRequest{Customers: []*CustomerUsage{{Used: []float64{1, 2, 3, 4, 5}}}}).Marshal()
	if err := r.Unmarshal(five); err == nil {
		t.Errorf("five usage values decoded: %v", r.Customers[0].Used)
	}
	var resp RefreshResponse
	if err := resp.Unmarshal(bytes.Repeat([]byte{0x0a, 0x00}, MaxEntries+1)); err == nil {
		t.Errorf("%d grants decoded", len(resp.Grants))
	}
}

func hasNaN(r *RefreshRequest) bool {
	for _, c := range r.Customers {
		for _, v := range append(append([]float64(nil), c.Used...), c.Demand, c.Share) {
			if math.IsNaN(v) {
				return true
			}
		}
	}
	return false
}

func clearUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				clearUnknown(v.List().Get(i).Message())
			}
		case fd.Message() != nil:
			clearUnknown(v.Message())
		}
		return true
	})
}
