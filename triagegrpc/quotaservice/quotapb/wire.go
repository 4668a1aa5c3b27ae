package quotapb

import (
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

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
