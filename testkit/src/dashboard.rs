//! A Ray dashboard stand-in for the head's snapshot poller: a real HTTP/1.1 server on
//! 127.0.0.1 that answers the endpoints the collector polls with Ray-shaped bodies, logs every
//! request, can hold one endpoint's answer back, and can switch to the answers of a dashboard
//! that is going down (each one a different kind of bad answer Ray gives while its GCS or
//! controllers stop). Stopped on drop.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the accept loop and a held-back answer look at the stop flag.
const POLL: Duration = Duration::from_millis(10);
/// Longest request head read, so a stuck client cannot keep a thread forever.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

pub const META: &str = "/api/v0/cluster_metadata";
pub const TIMEZONE: &str = "/timezone";
pub const SERVE: &str = "/api/serve/applications/";
pub const PLACEMENT_GROUPS: &str = "/api/v0/placement_groups?detail=1&limit=10000";
pub const JOBS: &str = "/api/jobs/";
/// The job the default job list names, and its datasets URI.
pub const JOB: &str = "02000000";
pub const DATASETS: &str = "/api/data/datasets/02000000";

/// One answer: status, content type and body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Answer {
    /// A 200 with a JSON body.
    pub fn json(body: &str) -> Answer {
        Answer {
            status: 200,
            content_type: "application/json",
            body: body.as_bytes().to_vec(),
        }
    }
}

#[derive(Default)]
struct State {
    answers: HashMap<String, Answer>,
    /// Request URIs (path and query) in the order received.
    log: Vec<String>,
    /// URI → how long its answer is held back.
    slow: HashMap<String, Duration>,
}

/// The stand-in; see the module doc.
pub struct DashboardStandIn {
    pub port: u16,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

/// Ray-shaped answers of the endpoints the poller asks (one job, with one dataset).
pub fn good_answers() -> HashMap<String, Answer> {
    let mut a = HashMap::new();
    let mut put = |uri: &str, body: &str| a.insert(uri.to_string(), Answer::json(body));
    put(
        META,
        r#"{"result": true, "msg": "", "data": {"rayVersion": "2.60.0", "pythonVersion": "3.11.9"}}"#,
    );
    put(TIMEZONE, r#"{"offset": "+00:00", "value": "UTC"}"#);
    put(
        SERVE,
        r#"{"proxy_location": "EveryNode", "applications": {"app1": {"status": "RUNNING"}}}"#,
    );
    put(
        PLACEMENT_GROUPS,
        r#"{"result": true, "msg": "", "data": {"result": {"total": 2, "result": [{"placement_group_id": "aa", "state": "CREATED"}, {"placement_group_id": "bb", "state": "CREATED"}]}}}"#,
    );
    put(
        JOBS,
        r#"[{"type": "SUBMISSION", "job_id": "02000000", "submission_id": "raysubmit_run", "status": "RUNNING"}]"#,
    );
    put(
        DATASETS,
        r#"{"datasets": [{"dataset": "dataset_1_0", "job_id": "02000000", "state": "RUNNING"}]}"#,
    );
    a
}

/// What a dashboard shutting down answered in place of each good answer, one kind of bad
/// answer per endpoint: a failure in a 200, an HTML page, a truncated body, an empty list.
pub fn going_down_answers() -> HashMap<String, Answer> {
    let mut a = HashMap::new();
    a.insert(
        META.to_string(),
        Answer::json(r#"{"result": false, "msg": "GCS unavailable", "data": {}}"#),
    );
    a.insert(
        TIMEZONE.to_string(),
        Answer {
            status: 200,
            content_type: "text/html",
            body: b"<html><body><h1>502 Bad Gateway</h1></body></html>".to_vec(),
        },
    );
    a.insert(
        SERVE.to_string(),
        Answer::json(r#"{"proxy_location": "EveryNode", "applications": {"app1": {"sta"#),
    );
    a.insert(
        PLACEMENT_GROUPS.to_string(),
        Answer::json(
            r#"{"result": true, "msg": "", "data": {"result": {"total": 0, "result": []}}}"#,
        ),
    );
    a.insert(
        JOBS.to_string(),
        Answer::json(r#"[{"type": "SUBMISSION", "job_id": "02000000", "status": "RUNNING"}]"#),
    );
    a.insert(
        DATASETS.to_string(),
        Answer::json(r#"{"result": false, "msg": "the stats actor is gone"}"#),
    );
    a
}

impl DashboardStandIn {
    /// Listens on a free loopback port and answers with [`good_answers`].
    pub fn start() -> Result<DashboardStandIn, String> {
        DashboardStandIn::start_on(0)
    }

    /// Listens on loopback port `port` (0: a free one) and answers with [`good_answers`]: a
    /// dashboard that comes up late on a port the collector was given before (nothing
    /// listens there until then, so its requests are refused, as when Ray's dashboard is not
    /// up yet).
    pub fn start_on(port: u16) -> Result<DashboardStandIn, String> {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let state = Arc::new(Mutex::new(State {
            answers: good_answers(),
            ..State::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let _ = conn.set_nonblocking(false);
                            let (state, stop) = (state.clone(), stop.clone());
                            std::thread::spawn(move || serve(conn, &state, &stop));
                        }
                        Err(_) => std::thread::sleep(POLL),
                    }
                }
            })
        };
        Ok(DashboardStandIn {
            port,
            state,
            stop,
            accept: Some(accept),
        })
    }

    /// `http://127.0.0.1:<port>`, for `--dashboard-address`.
    pub fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut st)
    }

    /// Answers `uri` with `answer` from now on.
    pub fn set(&self, uri: &str, answer: Answer) {
        self.with(|s| s.answers.insert(uri.to_string(), answer));
    }

    /// Replaces every answer that [`going_down_answers`] has a bad one for.
    pub fn go_down(&self) {
        self.with(|s| s.answers.extend(going_down_answers()));
    }

    /// Holds `uri`'s answer back for `delay` (the client's timeout usually ends it first).
    pub fn set_slow(&self, uri: &str, delay: Duration) {
        self.with(|s| s.slow.insert(uri.to_string(), delay));
    }

    /// The body `uri` is answered with now.
    pub fn body(&self, uri: &str) -> Vec<u8> {
        self.with(|s| {
            s.answers
                .get(uri)
                .map(|a| a.body.clone())
                .unwrap_or_default()
        })
    }

    /// Request URIs received so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.with(|s| s.log.clone())
    }

    /// How many times `uri` was asked.
    pub fn count(&self, uri: &str) -> usize {
        self.with(|s| s.log.iter().filter(|u| *u == uri).count())
    }
}

impl Drop for DashboardStandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request head and answers it, then closes the connection.
fn serve(stream: TcpStream, state: &Mutex<State>, stop: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut first = String::new();
    if reader.read_line(&mut first).unwrap_or(0) == 0 {
        return;
    }
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line.trim().is_empty() => break,
            Ok(_) => {}
        }
    }
    let uri = first.split_whitespace().nth(1).unwrap_or("").to_string();
    let (answer, delay) = {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        st.log.push(uri.clone());
        (st.answers.get(&uri).cloned(), st.slow.get(&uri).copied())
    };
    if let Some(d) = delay {
        let until = Instant::now() + d;
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(POLL);
        }
    }
    let a = answer.unwrap_or(Answer {
        status: 404,
        content_type: "text/plain",
        body: b"404: Not Found".to_vec(),
    });
    let head = format!(
        "HTTP/1.1 {} X\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        a.status,
        a.content_type,
        a.body.len()
    );
    let _ = writer.write_all(head.as_bytes());
    let _ = writer.write_all(&a.body);
    let _ = writer.flush();
}
