//! The fuzz targets' kept corpora (`fuzz/corpus/<target>/`: the seeds, and what the fuzzer
//! found worth keeping) run through the targets' entry points on every `cargo test`, so
//! that anything a fuzzer once found stays fixed without a fuzzer at hand.

use std::path::Path;

fn corpus(target: &str, run: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut inputs: Vec<_> = std::fs::read_dir(&dir).expect("the corpus is kept").map(|e| e.unwrap().path()).collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} has no inputs", dir.display());
    for input in inputs {
        let data = std::fs::read(&input).unwrap();
        eprintln!("{}", input.display());
        run(&data);
    }
}

#[test]
fn http() {
    corpus("http", turnlog::fuzzing::http);
}

#[test]
fn ids() {
    corpus("ids", turnlog::fuzzing::ids);
}

#[test]
fn acp() {
    corpus("acp", turnlog::fuzzing::acp);
}

#[test]
fn scripted() {
    corpus("scripted", turnlog::fuzzing::scripted);
}

#[test]
fn config() {
    corpus("config", turnlog::fuzzing::config);
}

#[test]
fn wal() {
    corpus("wal", turnlog::fuzzing::wal);
}

#[test]
fn import() {
    corpus("import", turnlog::fuzzing::import);
}
