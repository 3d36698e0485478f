//! Keys, limits and timeouts over HTTP on the fixture package: the API key, request, body
//! and header timeouts, a queue of zero, and a huge prompt beside other connections.

mod common;

use std::time::Duration;

use common::fixture::{MODEL, chat, config, fixture};
use common::{get, post, request, start};
use serde_json::{Value, json};

#[test]
fn an_api_key_guards_everything_but_health() {
    let dir = fixture();
    let mut c = config();
    c.api_key = Some("sekrit".into());
    let server = start(dir.path(), 1, c);
    let addr = server.addr();
    let body = chat(json!({})).to_string();
    let with = |auth: &[(&str, &str)]| {
        request(addr, "POST", "/v1/chat/completions", auth, body.as_bytes())
    };
    let missing = with(&[]);
    assert_eq!(missing.status, 401);
    assert_eq!(missing.json()["error"]["code"], "invalid_api_key");
    assert_eq!(with(&[("Authorization", "Bearer wrong")]).status, 401);
    assert_eq!(with(&[("Authorization", "Bearer sekrit")]).status, 200);
    assert_eq!(request(addr, "GET", "/v1/models", &[], b"").status, 401);
    assert_eq!(get(addr, "/health").status, 200);
    server.shutdown().unwrap();
}

#[test]
fn a_request_over_its_time_gets_503_and_frees_everything() {
    let dir = fixture();
    let mut c = config();
    c.request_timeout = Some(Duration::ZERO);
    let server = start(dir.path(), 1, c);
    let addr = server.addr();
    let r = post(addr, "/v1/chat/completions", &chat(json!({})));
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "timeout");
    // Streaming: headers went out first, so the error is a chunk, then [DONE].
    let s = post(addr, "/v1/chat/completions", &chat(json!({"stream": true})));
    assert_eq!(s.status, 200);
    let events = s.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "timeout");
    common::wait_idle(addr);
    server.shutdown().unwrap();
}

/// A body that trickles in is cut off at the body timeout with a 408, freeing the connection.
#[test]
fn a_body_that_does_not_arrive_in_time_gets_408() {
    use std::io::{Read, Write};
    let dir = fixture();
    let mut c = config();
    c.body_timeout = Duration::from_secs(1);
    let server = start(dir.path(), 1, c);
    let mut stream = std::net::TcpStream::connect(server.addr()).unwrap();
    stream
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"model\"",
        )
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = std::time::Instant::now();
    let mut reply = String::new();
    let mut buf = [0u8; 4096];
    while !reply.contains("request_timeout") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("request_timeout"), "{reply}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(get(server.addr(), "/health").status, 200);
    server.shutdown().unwrap();
}

/// Slow clients (slowloris) and idle ones cannot hold connections: a request head that
/// trickles in, a connection that sends nothing, and a kept-alive connection that sends no
/// next request are all closed at the header timeout, and the server keeps serving.
#[test]
fn connections_whose_request_head_does_not_arrive_in_time_are_closed() {
    use std::io::{Read, Write};
    let dir = fixture();
    let mut c = config();
    c.header_timeout = Duration::from_secs(1);
    let server = start(dir.path(), 1, c);
    let addr = server.addr();
    // How long until the server closes `stream` (reading whatever it answers first).
    let closed_after = |mut stream: std::net::TcpStream| {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let started = std::time::Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return started.elapsed(),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return started.elapsed();
                }
                Err(e) => panic!("still open after {:?}: {e}", started.elapsed()),
            }
        }
    };
    // One byte every 300 ms: the head would take 14 s; writing fails once it is closed.
    let trickle = std::thread::spawn(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        let started = std::time::Instant::now();
        for b in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaa" {
            if stream.write_all(&[*b]).is_err() {
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        None
    });
    let silent = std::net::TcpStream::connect(addr).unwrap();
    let mut kept_alive = std::net::TcpStream::connect(addr).unwrap();
    kept_alive
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut head = [0u8; 12];
    kept_alive.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    for (what, stream) in [("silent", silent), ("kept alive", kept_alive)] {
        let after = closed_after(stream);
        assert!(
            after < Duration::from_secs(4),
            "{what}: closed after {after:?}"
        );
    }
    let cut = trickle
        .join()
        .unwrap()
        .expect("the trickling head was never cut off");
    assert!(cut < Duration::from_secs(5), "trickle: cut after {cut:?}");
    assert_eq!(get(addr, "/health").status, 200, "still serving");
    server.shutdown().unwrap();
}

#[test]
fn a_queue_of_zero_and_huge_timeouts_still_serve() {
    let dir = fixture();
    let mut c = config();
    c.max_queue = 0;
    c.request_timeout = Some(Duration::MAX);
    c.shutdown_timeout = Duration::MAX;
    let server = start(dir.path(), 1, c);
    let addr = server.addr();
    let r = post(addr, "/v1/chat/completions", &chat(json!({})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    server.shutdown().unwrap();
}

/// The fixture package with a chat template that refuses system messages.
#[test]
fn a_huge_prompt_does_not_hold_up_other_connections() {
    let dir = fixture();
    let mut c = config();
    c.max_body = 64 << 20;
    let server = start(dir.path(), 1, c);
    let addr = server.addr();
    let prompt = "the cat and the dog ".repeat(1 << 18);
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1})
        .to_string()
        .into_bytes();
    let (sent, on_sent) = std::sync::mpsc::channel();
    let huge = std::thread::spawn(move || {
        let stream = common::send(addr, "POST", "/v1/completions", &[], &body);
        sent.send(()).unwrap();
        let reply = common::Conn::read_head(stream).finish();
        (reply, std::time::Instant::now())
    });
    on_sent.recv().unwrap();
    // Give the server a moment to start tokenizing what it received.
    std::thread::sleep(Duration::from_millis(100));
    let asked = std::time::Instant::now();
    assert_eq!(get(addr, "/health").status, 200);
    let answered = std::time::Instant::now();
    let (reply, huge_done) = huge.join().unwrap();
    assert_eq!(reply.json()["error"]["code"], "context_length_exceeded");
    assert!(
        answered + Duration::from_millis(200) < huge_done,
        "/health took {:?} and came back {:?} before the huge prompt's answer; it waited for \
         the tokenizer",
        answered - asked,
        huge_done.saturating_duration_since(answered)
    );
    server.shutdown().unwrap();
}
