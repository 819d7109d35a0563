//! Every scenario once at a tiny size against a real server started in-process on port 0
//! with a temp data dir, so the harness cannot rot. Speed is reported, never asserted; the
//! correctness checks are real: any violation fails the test.

use turnlog_load::scenarios::{run_all, Ctx, Scenario, Size};
use turnlog_load::Launcher;

struct Server {
    url: String,
    _dir: tempfile::TempDir,
}

async fn start() -> Server {
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut settings = turnlog::Settings::load(None).expect("the default settings");
    settings.server.addr = "127.0.0.1:0".into();
    settings.server.data_dir = dir.path().join("data");
    settings.server.workers = 2;
    settings.streams.max_streams_per_subject = 1_000_000;
    let app = turnlog::Application::build(settings).await.expect("the server starts");
    let url = format!("http://{}", app.addr());
    tokio::spawn(app.run_until_stopped());
    Server { url, _dir: dir }
}

async fn tiny(name: &str) {
    let server = start().await;
    let ctx =
        Ctx { launcher: Launcher::External { url: server.url.clone(), pid: Some(std::process::id()) }, quiet: true };
    let scenario = Scenario::named(name, Size::Tiny).expect("a scenario of that name");
    let reports = run_all(&ctx, vec![scenario]).await;
    let table = turnlog_load::report::markdown(&reports);
    println!("{table}");
    for report in &reports {
        assert!(report.violations.is_empty(), "{name}: {table}");
        assert!(!report.deadline_hit, "{name} hit its deadline: {table}");
        assert!(!report.rows.is_empty(), "{name} reported no figures");
        assert!(report.rows.iter().all(|r| r.value.is_finite()), "{name}: {table}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baseline_at_a_tiny_size() {
    tiny("baseline").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_at_a_tiny_size() {
    tiny("append").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_at_a_tiny_size() {
    tiny("turns").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_at_a_tiny_size() {
    tiny("fanout").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catchup_at_a_tiny_size() {
    tiny("catchup").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_at_a_tiny_size() {
    tiny("replay").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_at_a_tiny_size() {
    tiny("connections").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_at_a_tiny_size() {
    tiny("reconnect").await;
}
