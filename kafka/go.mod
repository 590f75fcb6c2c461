module github.com/keysched/keysched/kafka

go 1.26.0

require (
	github.com/alecthomas/kong v1.17.0
	github.com/keysched/keysched v0.1.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
	go.opentelemetry.io/otel/sdk/metric v1.46.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect
	github.com/puzpuzpuz/xsync/v4 v4.5.0 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/sdk v1.46.0 // indirect
	go.opentelemetry.io/otel/trace v1.46.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
)

require (
	github.com/keysched/keysched/otelkeysched v0.1.0
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/panjf2000/ants/v2 v2.12.1 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	go.opentelemetry.io/otel v1.46.0
	go.opentelemetry.io/otel/metric v1.46.0
	golang.org/x/sync v0.16.0 // indirect
)

replace github.com/keysched/keysched => ../

replace github.com/keysched/keysched/otelkeysched => ../otelkeysched
