//! Every Prometheus metric the service exports, in one place. Labels are route templates
//! and fixed names, never session ids.

use std::sync::LazyLock;

use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

pub static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);

fn register<T: prometheus::core::Collector + Clone + 'static>(metric: T) -> T {
    REGISTRY.register(Box::new(metric.clone())).expect("metric names are unique");
    metric
}

fn counter(name: &str, help: &str) -> IntCounter {
    register(IntCounter::new(name, help).expect("valid metric"))
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    register(Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid metric"))
}

pub static EVENTS_APPENDED: LazyLock<IntCounter> =
    LazyLock::new(|| counter("turnlog_events_appended_total", "Events made durable by the writer."));
pub static APPENDS_REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(Opts::new("turnlog_appends_refused_total", "Append requests refused."), &["reason"])
            .expect("valid metric"),
    )
});
pub static BATCH_EVENTS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "turnlog_writer_batch_events",
        "Events per group commit.",
        exponential_buckets(1.0, 4.0, 8).expect("buckets"),
    )
});
pub static FSYNC_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "turnlog_writer_fsync_seconds",
        "Time to make one group commit durable (its write-ahead log record, written and synced).",
        exponential_buckets(0.000_05, 2.0, 14).expect("buckets"),
    )
});
pub static CHECKPOINTS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter("turnlog_writer_checkpoints_total", "Segments of the write-ahead log made durable in sled and removed.")
});
pub static JETSTREAM_PUBLISH_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "turnlog_jetstream_publish_seconds",
        "Time from publishing an append batch to JetStream to its acknowledgement.",
        exponential_buckets(0.000_05, 2.0, 16).expect("buckets"),
    )
});
pub static RECENT_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    register(
        IntGauge::new(
            "turnlog_recent_bytes",
            "Bytes of sessions' newest events kept in memory for readers ([store] recent_kib, recent_total_mb).",
        )
        .expect("valid metric"),
    )
});
pub static JETSTREAM_CONSUMER_PENDING: LazyLock<IntGauge> = LazyLock::new(|| {
    register(
        IntGauge::new(
            "turnlog_jetstream_consumer_pending",
            "Messages of the stream this node's consumer has not delivered yet (its lag).",
        )
        .expect("valid metric"),
    )
});
pub static JETSTREAM_PUBLISHING: LazyLock<IntGauge> = LazyLock::new(|| {
    register(
        IntGauge::new(
            "turnlog_jetstream_publishing",
            "Sessions whose appends this node has sent to JetStream and is waiting for (or sending again) now.",
        )
        .expect("valid metric"),
    )
});
pub static JETSTREAM_FOLLOWERS_REPLACED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "turnlog_jetstream_followers_replaced_total",
                "Times this node replaced its consumer of the events stream (`events`) or its watch of the \
                 projections (`projections`) because it brought nothing the stream held (its server died).",
            ),
            &["follower"],
        )
        .expect("valid metric"),
    )
});
pub static PROJECTION_PUTS_SUPERSEDED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "turnlog_projection_puts_superseded_total",
        "Projection values not put because the bucket held one folded further (from another node, or an earlier \
         copy of the put).",
    )
});
pub static PROJECTIONS_REPAIRED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter("turnlog_projections_repaired_total", "Sessions whose projections were behind their log, made whole.")
});
pub static LEASE_CHANGES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("turnlog_lease_changes_total", "Session leases this node took, renewed, gave up or lost."),
            &["change"],
        )
        .expect("valid metric"),
    )
});
pub static FORWARDED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "turnlog_forwarded_total",
                "Session commands this node sent to the node holding the session's lease, or served for another node.",
            ),
            &["way"],
        )
        .expect("valid metric"),
    )
});
pub static STREAMS_OPEN: LazyLock<IntGauge> =
    LazyLock::new(|| register(IntGauge::new("turnlog_streams_open", "SSE streams open now.").expect("valid metric")));
pub static EVENTS_REPLAYED: LazyLock<IntCounter> =
    LazyLock::new(|| counter("turnlog_stream_events_replayed_total", "Events sent to streams from the store."));
pub static EVENTS_LIVE: LazyLock<IntCounter> =
    LazyLock::new(|| counter("turnlog_stream_events_live_total", "Events sent to streams from the live bus."));
pub static SUBSCRIBERS_LAGGED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter("turnlog_stream_lagged_total", "Times a stream fell behind the live bus and re-read the store.")
});
pub static SUBSCRIBERS_DROPPED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter("turnlog_stream_backlog_disconnects_total", "Streams closed because they fell too far behind.")
});
pub static CLIENTS_CUT_OFF: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "turnlog_clients_cut_off_total",
                "Connections cut off: request_timeout (no whole request head in time), body_timeout (a body that \
                 did not all arrive in time), stalled_stream (a streamed answer its client stopped taking).",
            ),
            &["reason"],
        )
        .expect("valid metric"),
    )
});
pub static CONNECTIONS_OPEN: LazyLock<IntGauge> = LazyLock::new(|| {
    register(IntGauge::new("turnlog_http_connections_open", "HTTP connections open now.").expect("valid metric"))
});
pub static HTTP_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(Opts::new("turnlog_http_requests_total", "HTTP requests."), &["method", "route", "status"])
            .expect("valid metric"),
    )
});
pub static HTTP_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new("turnlog_http_request_seconds", "Time to the response head.")
                .buckets(exponential_buckets(0.000_1, 2.5, 12).expect("buckets")),
            &["method", "route"],
        )
        .expect("valid metric"),
    )
});
pub static TURNS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(Opts::new("turnlog_turns_total", "Turns ended, by stop reason."), &["stop_reason"])
            .expect("valid metric"),
    )
});
pub static TURNS_RESUMED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new("turnlog_turns_resumed_total", "Turns a stopped process left running, resumed here.")
            .expect("valid metric"),
    )
});
pub static MODEL_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new("turnlog_model_request_seconds", "Model request latency.")
                .buckets(exponential_buckets(0.001, 2.5, 12).expect("buckets")),
            &["provider"],
        )
        .expect("valid metric"),
    )
});
pub static MODEL_TOKENS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(Opts::new("turnlog_model_tokens_total", "Model tokens."), &["provider", "direction"])
            .expect("valid metric"),
    )
});
pub static COMPACTIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "turnlog_compactions_total",
                "History compactions, by strategy (summary, tool_outputs) or failed.",
            ),
            &["outcome"],
        )
        .expect("valid metric"),
    )
});
pub static TOOL_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new("turnlog_tool_seconds", "Server tool latency.")
                .buckets(exponential_buckets(0.000_1, 3.0, 12).expect("buckets")),
            &["tool"],
        )
        .expect("valid metric"),
    )
});

/// Forces every metric into the registry so `/metrics` lists them before first use.
pub fn init() {
    LazyLock::force(&EVENTS_APPENDED);
    LazyLock::force(&APPENDS_REFUSED);
    LazyLock::force(&BATCH_EVENTS);
    LazyLock::force(&FSYNC_SECONDS);
    LazyLock::force(&CHECKPOINTS);
    LazyLock::force(&STREAMS_OPEN);
    LazyLock::force(&EVENTS_REPLAYED);
    LazyLock::force(&EVENTS_LIVE);
    LazyLock::force(&SUBSCRIBERS_LAGGED);
    LazyLock::force(&SUBSCRIBERS_DROPPED);
    for reason in ["request_timeout", "body_timeout", "stalled_stream"] {
        CLIENTS_CUT_OFF.with_label_values(&[reason]);
    }
    LazyLock::force(&CONNECTIONS_OPEN);
    LazyLock::force(&HTTP_REQUESTS);
    LazyLock::force(&HTTP_SECONDS);
    LazyLock::force(&TURNS);
    LazyLock::force(&TURNS_RESUMED);
    LazyLock::force(&MODEL_SECONDS);
    LazyLock::force(&MODEL_TOKENS);
    LazyLock::force(&COMPACTIONS);
    LazyLock::force(&TOOL_SECONDS);
}

/// The text exposition of every metric.
pub fn render() -> String {
    let mut out = Vec::new();
    TextEncoder::new().encode(&REGISTRY.gather(), &mut out).expect("text encoding never fails");
    String::from_utf8(out).expect("prometheus text is utf-8")
}
