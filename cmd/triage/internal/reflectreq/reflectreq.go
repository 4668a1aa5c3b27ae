// Package reflectreq encodes a gRPC request message given as JSON, for a
// method of a server that serves gRPC server reflection: it asks the
// server for the method's descriptors, parses the JSON into the method's
// input type (protojson) and returns the message's wire bytes.
package reflectreq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"google.golang.org/grpc"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// maxFiles bounds the descriptor files one lookup may fetch.
const maxFiles = 256

// Encode returns the wire bytes of the JSON request text for method
// ("/package.Service/Method") on the server behind cc, read through the
// server's reflection service (grpc.reflection.v1).
func Encode(ctx context.Context, cc grpc.ClientConnInterface, method, text string) ([]byte, error) {
	svc, name, ok := splitMethod(method)
	if !ok {
		return nil, fmt.Errorf(`reflectreq: method %q is not "/package.Service/Method"`, method)
	}
	files, err := fetch(ctx, cc, svc)
	if err != nil {
		return nil, err
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("reflectreq: the server does not describe %s: %w", svc, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("reflectreq: %s is not a service", svc)
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		return nil, fmt.Errorf("reflectreq: service %s has no method %s", svc, name)
	}
	msg := dynamicpb.NewMessage(md.Input())
	if err := protojson.Unmarshal([]byte(text), msg); err != nil {
		return nil, fmt.Errorf("reflectreq: the request is not a %s in JSON: %w", md.Input().FullName(), err)
	}
	return proto.Marshal(msg)
}

func splitMethod(m string) (svc, name string, ok bool) {
	m, ok = strings.CutPrefix(m, "/")
	if !ok {
		return "", "", false
	}
	svc, name, ok = strings.Cut(m, "/")
	return svc, name, ok && svc != "" && name != "" && !strings.Contains(name, "/")
}

// fetch asks for the file that defines symbol and every file it imports
// that the server did not send with it, and builds them into a registry.
func fetch(ctx context.Context, cc grpc.ClientConnInterface, symbol string) (*protoregistry.Files, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := rpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, fmt.Errorf("reflectreq: server reflection: %w", err)
	}
	protos := map[string]*descriptorpb.FileDescriptorProto{}
	ask := func(req *rpb.ServerReflectionRequest) error {
		// io.EOF from Send means the server ended the stream: its status
		// comes from Recv.
		if err := stream.Send(req); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reflectreq: server reflection: %w", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("reflectreq: server reflection (does the server register it? else give the request's bytes): %w", err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			return fmt.Errorf("reflectreq: server reflection: %s", e.GetErrorMessage())
		}
		for _, b := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
			fd := new(descriptorpb.FileDescriptorProto)
			if err := proto.Unmarshal(b, fd); err != nil {
				return fmt.Errorf("reflectreq: a descriptor from the server: %w", err)
			}
			if len(protos) >= maxFiles {
				return fmt.Errorf("reflectreq: over %d descriptor files", maxFiles)
			}
			protos[fd.GetName()] = fd
		}
		return nil
	}
	if err := ask(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}}); err != nil {
		return nil, err
	}
	files := new(protoregistry.Files)
	var build func(name string, depth int) error
	build = func(name string, depth int) error {
		if _, err := files.FindFileByPath(name); err == nil {
			return nil
		}
		if depth > 64 {
			return errors.New("reflectreq: imports nested too deep")
		}
		fd, ok := protos[name]
		if !ok {
			if err := ask(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileByFilename{FileByFilename: name}}); err != nil {
				return err
			}
			if fd, ok = protos[name]; !ok {
				return fmt.Errorf("reflectreq: the server did not send %s", name)
			}
		}
		for _, dep := range fd.GetDependency() {
			if err := build(dep, depth+1); err != nil {
				return err
			}
		}
		f, err := protodesc.NewFile(fd, files)
		if err != nil {
			return fmt.Errorf("reflectreq: %s: %w", name, err)
		}
		return files.RegisterFile(f)
	}
	for _, fd := range protos {
		if err := build(fd.GetName(), 0); err != nil {
			return nil, err
		}
	}
	return files, nil
}
