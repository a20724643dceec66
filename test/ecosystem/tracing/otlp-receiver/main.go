// A minimal OpenTelemetry Collector for the trace tests: the collector's own OTLP receiver
// (OTLP/HTTP, and OTLP/gRPC when asked) feeding a consumer that writes every batch of
// spans it receives as one line of OTLP JSON, the collector's file-exporter format.
//
//	otlp-receiver -http 127.0.0.1:4318 [-grpc 127.0.0.1:4317] [-out FILE]
//
// It prints "listening http=ADDR" on stdout once the receiver is up and runs until SIGTERM/SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configgrpc"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
)

func main() {
	httpAddr := flag.String("http", "127.0.0.1:4318", "OTLP/HTTP listen address")
	grpcAddr := flag.String("grpc", "", "OTLP/gRPC listen address (off when empty)")
	outPath := flag.String("out", "", "file the JSON lines are appended to (stdout when empty)")
	flag.Parse()

	out := os.Stdout
	if *outPath != "" {
		f, err := os.OpenFile(*outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fail(err)
		}
		defer f.Close()
		out = f
	}
	var mu sync.Mutex
	marshaler := &ptrace.JSONMarshaler{}
	sink, err := consumer.NewTraces(func(_ context.Context, td ptrace.Traces) error {
		line, err := marshaler.MarshalTraces(td)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		_, err = out.Write(append(line, '\n'))
		return err
	})
	if err != nil {
		fail(err)
	}

	factory := otlpreceiver.NewFactory()
	cfg := factory.CreateDefaultConfig().(*otlpreceiver.Config)
	cfg.Protocols.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = *httpAddr
	if *grpcAddr == "" {
		cfg.Protocols.GRPC = configoptional.None[configgrpc.ServerConfig]()
	} else {
		cfg.Protocols.GRPC.GetOrInsertDefault().NetAddr.Endpoint = *grpcAddr
	}
	ctx := context.Background()
	receiver, err := factory.CreateTraces(ctx, receivertest.NewNopSettings(factory.Type()), cfg, sink)
	if err != nil {
		fail(err)
	}
	if err := receiver.Start(ctx, componenttest.NewNopHost()); err != nil {
		fail(err)
	}
	fmt.Fprintf(os.Stdout, "listening http=%s\n", *httpAddr)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	if err := receiver.Shutdown(ctx); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "otlp-receiver:", err)
	os.Exit(1)
}
