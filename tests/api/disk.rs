//! Disk faults on the real binary: its data dir on a small tmpfs that fills up while appends
//! go on. Appends are refused with 503 and store nothing, everything acknowledged stays,
//! reads go on, and appends succeed again, numbered right after the last acknowledged one,
//! once there is room; a SIGKILL and restart after all that loses nothing.
//! (Mounting a tmpfs needs root, as the test command runs.)

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::{ids, launch};

/// A tmpfs mounted on a directory for the test's life.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting a tmpfs on {} failed: the disk fault test needs root", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` with one file, leaving about `room` bytes free.
fn fill(dir: &Path, room: u64) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    while file.write_all(&chunk).is_ok() {}
    let written = std::fs::metadata(&path).unwrap().len();
    file.set_len(written.saturating_sub(room)).unwrap();
    path
}

async fn events(client: &reqwest::Client, url: &str, session: &str) -> Vec<Value> {
    let page: Value =
        client.get(format!("{url}/sessions/{session}/events?limit=1000")).send().await.unwrap().json().await.unwrap();
    page["data"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_full_disk_refuses_appends_with_503_loses_nothing_and_recovers() {
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    let _tmpfs = Tmpfs::mount(&data, "24m");
    let config = work.path().join("config.toml");
    // Appends are refused while less than 4 MiB is free.
    std::fs::write(&config, "[store]\nmin_free_mb = 4\n").unwrap();
    let (mut server, url) = launch(&config, &data, "127.0.0.1:0").await.unwrap();
    let client = reqwest::Client::new();
    let created: Value = client
        .post(format!("{url}/sessions"))
        .json(&json!({"agent": {"name": "default"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session = created["sessionId"].as_str().unwrap().to_string();
    let append = |i: usize| {
        let event = json!({"type": "user.define_outcome", "outcome": {"i": i, "pad": "x".repeat(1000)}});
        client.post(format!("{url}/sessions/{session}/events")).json(&json!({"events": [event]})).send()
    };

    // Full but for 4.5 MiB: four writers append at once until each is refused, cleanly
    // (appends of one session in one commit, and appends numbered after refused ones, are
    // refused together).
    let filler = fill(&data, 9 << 19);
    let writers = (0..4).map(|w| {
        let (client, url, session) = (client.clone(), url.clone(), session.clone());
        tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for i in 0..5000 {
                let outcome = json!({"w": w, "i": i, "pad": "x".repeat(1000)});
                let event = json!({"type": "user.define_outcome", "outcome": outcome});
                let response =
                    client.post(format!("{url}/sessions/{session}/events")).json(&json!({"events": [event]})).send();
                let response = response.await.unwrap();
                match response.status().as_u16() {
                    200 => acknowledged.push(response.json::<Value>().await.unwrap()["data"][0].clone()),
                    503 => return (acknowledged, response.json::<Value>().await.unwrap()),
                    other => panic!("an append answered {other}: {}", response.text().await.unwrap()),
                }
            }
            panic!("a full disk never refused an append");
        })
    });
    let mut acknowledged = Vec::new();
    for writer in writers.collect::<Vec<_>>() {
        let (acks, refusal) = writer.await.unwrap();
        let message = refusal["error"]["message"].as_str().unwrap();
        assert!(message.contains("stored") && message.contains("send it again"), "{refusal}");
        acknowledged.extend(acks);
    }
    acknowledged.sort_by_key(|e| e["sequence_number"].as_u64().unwrap());
    assert!(acknowledged.len() > 100, "appends fit until the disk was full: {}", acknowledged.len());
    // Still full: refused again, and nothing of it stored; reads go on.
    for _ in 0..3 {
        assert_eq!(append(99_999).await.unwrap().status(), 503);
    }
    let log = events(&client, &url, &session).await;
    assert_eq!(ids(&log[1..]), ids(&acknowledged), "exactly what was acknowledged");

    // Room again: appends succeed, numbered right after the last acknowledged one.
    std::fs::remove_file(&filler).unwrap();
    let last = acknowledged.last().unwrap()["sequence_number"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let next = loop {
        let response = append(acknowledged.len()).await.unwrap();
        if response.status() == 200 {
            break response.json::<Value>().await.unwrap()["data"][0].clone();
        }
        assert_eq!(response.status(), 503);
        assert!(Instant::now() < deadline, "appends never succeeded again");
    };
    assert_eq!(next["sequence_number"].as_u64(), Some(last + 1), "no gap: {next}");
    acknowledged.push(next);
    // And a turn runs (the session's actor is not left with what was not stored).
    let turn = json!({"stream": "none", "messages": [{"role": "user", "content": "still here"}]});
    let answer: Value =
        client.post(format!("{url}/sessions/{session}/turns")).json(&turn).send().await.unwrap().json().await.unwrap();
    assert_eq!(answer["messages"][0]["content"], "echo: still here", "{answer}");

    // A SIGKILL and a restart lose nothing acknowledged, and every chain verifies.
    let before = events(&client, &url, &session).await;
    server.kill().await.unwrap();
    let (_server, url) = launch(&config, &data, "127.0.0.1:0").await.unwrap();
    let after = events(&client, &url, &session).await;
    assert_eq!(after, before, "byte for byte after the restart");
    for event in &acknowledged {
        assert!(after.contains(event), "acknowledged {event} is there");
    }
    let seqs: Vec<u64> = after.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=after.len() as u64).collect::<Vec<_>>());
    let audit: Value =
        client.get(format!("{url}/sessions/{session}/audit?verify=true")).send().await.unwrap().json().await.unwrap();
    assert_eq!(audit["verified"], true, "{audit}");
}

/// The write-ahead log itself out of room (its directory on a tmpfs of its own, and no room
/// kept): the record that does not fit is cut off again, the append is refused with 503, and
/// appends go on, with no gap, once there is room.
#[tokio::test]
async fn a_write_ahead_log_out_of_room_refuses_the_commit_and_goes_on() {
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    let _tmpfs = Tmpfs::mount(&data.join("wal"), "2m");
    let config = work.path().join("config.toml");
    std::fs::write(&config, "[store]\nmin_free_mb = 0\n").unwrap();
    let (mut server, url) = launch(&config, &data, "127.0.0.1:0").await.unwrap();
    let client = reqwest::Client::new();
    let created: Value = client
        .post(format!("{url}/sessions"))
        .json(&json!({"agent": {"name": "default"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session = created["sessionId"].as_str().unwrap().to_string();
    let append = |i: usize| {
        let event = json!({"type": "user.define_outcome", "outcome": {"i": i, "pad": "x".repeat(1000)}});
        client.post(format!("{url}/sessions/{session}/events")).json(&json!({"events": [event]})).send()
    };
    let filler = fill(&data.join("wal"), 100 << 10);
    let mut acknowledged = Vec::new();
    loop {
        assert!(acknowledged.len() < 1000, "a full write-ahead log never refused an append");
        let response = append(acknowledged.len()).await.unwrap();
        match response.status().as_u16() {
            200 => acknowledged.push(response.json::<Value>().await.unwrap()["data"][0].clone()),
            503 => break,
            other => panic!("an append answered {other}: {}", response.text().await.unwrap()),
        }
    }
    assert!(acknowledged.len() > 10, "appends fit until the log was full: {}", acknowledged.len());
    assert_eq!(append(99_999).await.unwrap().status(), 503);
    assert_eq!(ids(&events(&client, &url, &session).await[1..]), ids(&acknowledged));
    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let next: Value = loop {
        let response = append(acknowledged.len()).await.unwrap();
        if response.status() == 200 {
            break response.json::<Value>().await.unwrap()["data"][0].clone();
        }
        assert_eq!(response.status(), 503);
        assert!(Instant::now() < deadline, "appends never succeeded again");
    };
    let last = acknowledged.last().unwrap()["sequence_number"].as_u64().unwrap();
    assert_eq!(next["sequence_number"].as_u64(), Some(last + 1), "no gap: {next}");
    acknowledged.push(next);
    // Nothing of the refused records was left in the log: a restart replays it cleanly.
    let before = events(&client, &url, &session).await;
    server.kill().await.unwrap();
    let (_server, url) = launch(&config, &data, "127.0.0.1:0").await.unwrap();
    assert_eq!(events(&client, &url, &session).await, before);
}
