//! SIGKILL the real server while several clients append, restart it on the same data dir,
//! and check that nothing acknowledged was lost.

use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::helpers::spawn_app;
use crate::stream::check_log;

#[tokio::test]
async fn acknowledged_events_survive_sigkill() {
    let mut app = spawn_app().await;
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(app.create_session().await);
    }
    for round in 0..2 {
        let acked: Arc<Mutex<Vec<Value>>> = Arc::default();
        let mut writers = Vec::new();
        for w in 0..8 {
            let (url, sessions, acked) = (app.url.clone(), sessions.clone(), acked.clone());
            writers.push(tokio::spawn(async move {
                let client = reqwest::Client::new();
                for i in 0.. {
                    let session = &sessions[(w + i) % sessions.len()];
                    let n = 1 + (i % 5);
                    let events: Vec<Value> = (0..n)
                        .map(|k| json!({"type": "user.define_outcome", "outcome": format!("r{round}-w{w}-{i}-{k}")}))
                        .collect();
                    let sent = client
                        .post(format!("{url}/sessions/{session}/events"))
                        .json(&json!({"events": events}))
                        .send()
                        .await;
                    let Ok(response) = sent else { return };
                    if response.status() != 200 {
                        return;
                    }
                    let Ok(body) = response.json::<Value>().await else { return };
                    acked.lock().extend(body["data"].as_array().unwrap().iter().cloned());
                }
            }));
        }
        while acked.lock().len() < 3000 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        app.kill().await;
        for writer in writers {
            writer.await.unwrap();
        }
        let acked = acked.lock().clone();
        app.restart().await;

        let mut stored = std::collections::HashMap::new();
        let mut last_ids = std::collections::HashMap::new();
        for session in &sessions {
            let response = app.get(&format!("/sessions/{session}")).send().await.unwrap();
            assert_eq!(response.status(), 200, "the session index survived");
            let count = app.all_events(session).await.len();
            let all = check_log(&app, session, count).await;
            last_ids.insert(session.clone(), all.last().unwrap()["id"].as_str().unwrap().to_string());
            for event in all {
                stored.insert(event["id"].as_str().unwrap().to_string(), event);
            }
        }
        for event in &acked {
            let id = event["id"].as_str().unwrap();
            assert_eq!(stored.get(id), Some(event), "acknowledged event {id} is stored exactly as acknowledged");
        }
        for session in &sessions {
            let before = app.all_events(session).await.len();
            let new = app.post_outcomes(session, &["after the crash".to_string()]).await;
            assert!(new[0]["id"].as_str().unwrap() > last_ids[session].as_str(), "new ids sort after every old one");
            assert_eq!(new[0]["sequence_number"], before as u64 + 1);
        }
    }
}
