// A stand-in execserver on a stock grpc-go server, for the keepalive test
// (test/polyglot/grpc-go-keepalive.test.ts). It keeps grpc-go's default keepalive
// enforcement (at most one HTTP/2 PING per 5 minutes, GOAWAY "too_many_pings" after a
// few more) and speaks just enough of BrokerService.Connect on raw bytes: the HELLO given
// in hex as the first argument, then a PONG for every PING (a Ping{nonce} frame is field
// 5 of ConnectRequest and a Pong{nonce} is field 4 of ConnectResponse, with the same body).
//
//	grpc-go-server HELLO_HEX   prints "listening 127.0.0.1:PORT", serves until killed
package main

import (
	"encoding/hex"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc"
)

// rawCodec passes message bytes through untouched.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

func main() {
	hello, err := hex.DecodeString(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "HELLO_HEX:", err)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// No grpc.KeepaliveEnforcementPolicy: the stock defaults are the point.
	server := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		if method != "/slotbroker.v1.BrokerService/Connect" {
			return fmt.Errorf("unknown method %s", method)
		}
		if err := stream.SendMsg(&hello); err != nil {
			return err
		}
		for {
			var frame []byte
			if err := stream.RecvMsg(&frame); err != nil {
				return nil
			}
			if len(frame) > 0 && frame[0] == 5<<3|2 {
				pong := append([]byte{4<<3 | 2}, frame[1:]...)
				if err := stream.SendMsg(&pong); err != nil {
					return err
				}
			}
		}
	}))
	fmt.Printf("listening %s\n", ln.Addr())
	if err := server.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
