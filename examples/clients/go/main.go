// A minimal slotbroker fylr in Go, written against stubs generated from proto/ (see
// README.md). It opens one broker stream to an execserver, reads HELLO, parks a WANT,
// answers the OFFER with a JOB whose stdin and stdout are one-time URLs it serves itself,
// waits for DONE, and checks that the bytes that came back through its stdout URL have
// the digest they should.
//
//	slotbroker-go-fylr -addr 127.0.0.1:7600 -service cat -size 8388608
//
// With the `cat` service the output must equal the input; with `sha256sum` it must be the
// input's hex digest. Set SLOTBROKER_TOKEN when the execserver has a token, and
// SLOTBROKER_CA_FILE (its certificate's CA) when it serves TLS, plus SLOTBROKER_CERT_FILE
// and SLOTBROKER_KEY_FILE when it asks for a client certificate (mTLS). Exit status:
// 0 when the digest matched, 1 when the job failed or the digest did not match, 2 for a
// usage or connection problem.
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "slotbroker.example/goclient/gen/slotbroker/v1"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7600", "execserver gRPC address")
	service := flag.String("service", "cat", "service to run: cat (output = input) or sha256sum (output = its digest)")
	size := flag.Int("size", 8<<20, "bytes of random input")
	pipeListen := flag.String("pipe-listen", "127.0.0.1:0", "where this client serves its one-time pipe URLs")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := run(ctx, *addr, *service, *size, *pipeListen, os.Getenv("SLOTBROKER_TOKEN")); err != nil {
		fmt.Fprintln(os.Stderr, "slotbroker-go-fylr:", err)
		var mismatch digestError
		if errors.As(err, &mismatch) {
			os.Exit(1)
		}
		os.Exit(2)
	}
}

// transportCredentials: plaintext without a CA file; TLS verified against caFile with one,
// presenting certFile/keyFile as the client certificate when they are given (mTLS).
func transportCredentials(caFile, certFile, keyFile string) (credentials.TransportCredentials, error) {
	if caFile == "" {
		return insecure.NewCredentials(), nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", caFile)
	}
	config := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(config), nil
}

// digestError is a job that ran but did not produce what it should (exit status 1).
type digestError struct{ msg string }

func (e digestError) Error() string { return e.msg }

func run(ctx context.Context, addr, service string, size int, pipeListen, token string) error {
	input := make([]byte, size)
	if _, err := rand.Read(input); err != nil {
		return err
	}
	want := sha256.Sum256(input)

	// HTTP/2 keepalive no more often than stock gRPC servers allow; liveness on the stream
	// itself would be the application Ping (not needed for one short job).
	creds, err := transportCredentials(os.Getenv("SLOTBROKER_CA_FILE"), os.Getenv("SLOTBROKER_CERT_FILE"), os.Getenv("SLOTBROKER_KEY_FILE"))
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Minute, Timeout: 20 * time.Second, PermitWithoutStream: true}))
	if err != nil {
		return err
	}
	defer conn.Close()

	md := metadata.Pairs("slotbroker-client", "go-example")
	if token != "" {
		md.Append("authorization", "Bearer "+token)
	}
	stream, err := pb.NewBrokerServiceClient(conn).Connect(metadata.NewOutgoingContext(ctx, md))
	if err != nil {
		return explain(err)
	}

	// The first frame is always HELLO.
	first, err := stream.Recv()
	if err != nil {
		return explain(err)
	}
	hello := first.GetHello()
	if hello == nil {
		return fmt.Errorf("expected HELLO first, got %T", first.GetFrame())
	}
	if _, ok := hello.GetServices()[service]; !ok {
		return fmt.Errorf("execserver %s does not offer %q (it offers: %s)", hello.GetInstanceId(), service, strings.Join(mapsKeys(hello.GetServices()), ", "))
	}
	halfCloseWaits := slices.Contains(hello.GetCapabilities(), "half-close")

	pipes, err := servePipes(pipeListen, pipeHost(hello.GetPeerAddress()), input)
	if err != nil {
		return err
	}
	defer pipes.close()

	jobID := fmt.Sprintf("go-%x", want[:6])
	if err := stream.Send(&pb.ConnectRequest{Frame: &pb.ConnectRequest_Want{Want: &pb.Want{JobId: jobID, Service: service}}}); err != nil {
		return explain(err)
	}

	var receipt *pb.Receipt
	for receipt == nil {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("stream ended before DONE: %w", explain(err))
		}
		switch f := resp.GetFrame().(type) {
		case *pb.ConnectResponse_Offer:
			if f.Offer.GetJobId() != jobID {
				continue
			}
			job := &pb.Job{JobId: jobID, OfferToken: f.Offer.GetOfferToken(), Spec: &pb.JobSpec{StdinUrl: pipes.inURL, StdoutUrl: pipes.outURL}}
			if err := stream.Send(&pb.ConnectRequest{Frame: &pb.ConnectRequest_Job{Job: job}}); err != nil {
				return explain(err)
			}
			// A half-close is a goodbye that still gets the DONE of running jobs.
			if halfCloseWaits {
				if err := stream.CloseSend(); err != nil {
					return err
				}
			}
		case *pb.ConnectResponse_OfferExpired:
			// Too slow to answer: the want is gone; park it again.
			if err := stream.Send(&pb.ConnectRequest{Frame: &pb.ConnectRequest_Want{Want: &pb.Want{JobId: jobID, Service: service}}}); err != nil {
				return explain(err)
			}
		case *pb.ConnectResponse_Reject:
			return fmt.Errorf("execserver rejected %s: %s (%s)", f.Reject.GetJobId(), f.Reject.GetMessage(), f.Reject.GetCode())
		case *pb.ConnectResponse_Done:
			if f.Done.GetJobId() == jobID {
				receipt = f.Done.GetReceipt()
			}
		default:
			// HELLO updates, PONGs and frame kinds added later are skipped.
		}
	}
	if !halfCloseWaits {
		if err := stream.CloseSend(); err != nil {
			return err
		}
	}
	// After the half-close the server ends the stream with OK.
	if _, err := stream.Recv(); err != io.EOF {
		return fmt.Errorf("expected the execserver to end the stream after DONE, got %v", err)
	}

	if receipt.GetError() != pb.ErrorKind_ERROR_KIND_UNSPECIFIED || receipt.ExitCode == nil || receipt.GetExitCode() != 0 {
		return digestError{fmt.Sprintf("job failed: exit %v signal %q error %s %q stderr %q", receipt.ExitCode, receipt.GetSignal(), receipt.GetError(), receipt.GetErrorMessage(), receipt.GetStderrLine())}
	}
	got, n, complete := pipes.output()
	if receipt.GetStdoutStreamed() {
		if !complete {
			return digestError{"the stdout upload did not complete"}
		}
	} else {
		got, n = sha256.Sum256(receipt.GetStdoutPrefix()), len(receipt.GetStdoutPrefix())
		if uint64(n) != receipt.GetStdoutBytes() {
			return digestError{fmt.Sprintf("output was cut: %d of %d bytes (no stdout URL?)", n, receipt.GetStdoutBytes())}
		}
	}
	var expect [32]byte
	switch service {
	case "sha256sum":
		expect = sha256.Sum256([]byte(hex.EncodeToString(want[:]) + "  -\n"))
	default:
		expect = want
	}
	if got != expect {
		return digestError{fmt.Sprintf("output digest %x, want %x (%d bytes back)", got, expect, n)}
	}
	fmt.Printf("ok: %s on %s, %d bytes in, %d bytes out, sha256 %x, %s\n",
		service, receipt.GetInstanceId(), len(input), n, got, receipt.GetDuration().AsDuration())
	return nil
}

// explain turns a gRPC status into a sentence a user can act on.
func explain(err error) error {
	if errors.Is(err, io.EOF) {
		return errors.New("the execserver ended the stream")
	}
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch s.Code() {
	case codes.Unauthenticated:
		return fmt.Errorf("the execserver refused the token (UNAUTHENTICATED): set SLOTBROKER_TOKEN to its token (%s)", s.Message())
	case codes.Unavailable:
		return fmt.Errorf("cannot reach the execserver (UNAVAILABLE): %s", s.Message())
	}
	return fmt.Errorf("%s: %s", s.Code(), s.Message())
}

// pipeHost is the host the execserver saw this client come from: an address it can reach.
func pipeHost(peer string) string {
	host, _, err := net.SplitHostPort(peer)
	if err != nil || host == "" {
		return "127.0.0.1"
	}
	return host
}

// pipes serves one stdin URL and one stdout URL, each exactly once.
type pipes struct {
	inURL, outURL string
	server        *http.Server
	mu            sync.Mutex
	digest        [32]byte
	bytes         int
	complete      bool
}

func servePipes(listen, host string, input []byte) (*pipes, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	id := func() string {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}
	inID, outID := id(), id()
	base := "http://" + net.JoinHostPort(host, fmt.Sprint(port))
	p := &pipes{inURL: base + "/in/" + inID, outURL: base + "/out/" + outID}
	var inUsed, outUsed sync.Once
	mux := http.NewServeMux()
	mux.HandleFunc("GET /in/"+inID, func(w http.ResponseWriter, _ *http.Request) {
		served := false
		inUsed.Do(func() {
			served = true
			w.Header().Set("Content-Length", fmt.Sprint(len(input)))
			_, _ = w.Write(input)
		})
		if !served {
			http.Error(w, "this pipe was already used", http.StatusGone)
		}
	})
	mux.HandleFunc("PUT /out/"+outID, func(w http.ResponseWriter, r *http.Request) {
		served := false
		outUsed.Do(func() {
			served = true
			h := sha256.New()
			n, err := io.Copy(h, r.Body)
			p.mu.Lock()
			defer p.mu.Unlock()
			p.bytes = int(n)
			// A body that breaks off (no final chunk) is a failed job, never short output.
			if err != nil {
				http.Error(w, "upload broke off: "+err.Error(), http.StatusBadRequest)
				return
			}
			copy(p.digest[:], h.Sum(nil))
			p.complete = true
			w.WriteHeader(http.StatusNoContent)
		})
		if !served {
			http.Error(w, "this pipe was already used", http.StatusGone)
		}
	})
	p.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.server.Serve(ln) }()
	return p, nil
}

func (p *pipes) output() ([32]byte, int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.digest, p.bytes, p.complete
}

func (p *pipes) close() { _ = p.server.Close() }

func mapsKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
