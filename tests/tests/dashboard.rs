//! The dashboard page in a real browser: `gsharectl up` runs a local region
//! with its demo load; headless Chromium (Debian's `chromium`) opens the
//! `dashboard:` link it printed, lets the page's script poll the `/v1` API
//! (`--virtual-time-budget`) and prints the DOM (`--dump-dom`). The test
//! checks that every node and GPU of the topology and every deployed
//! function are on the page with the figures the API gives, that the
//! figures move while the load runs, that a tenant's link shows only its
//! own part, and that `/` itself holds no data; it saves a screenshot
//! under `target/dashboard-test/` and prints its path.
//!
//! Chromium is required: without it the test fails (CI installs it, see
//! `.ci/run`). Locally, `GSHARE_SKIP_BROWSER_TEST=1` skips it when
//! Chromium is missing; `GSHARE_CHROMIUM=<path>` names another binary.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use gshare_region::http_client::request;
use serde_json::Value;

/// How long the whole run may take before the test gives up.
const RUN_LIMIT: Duration = Duration::from_secs(300);
/// How long one Chromium run may take.
const BROWSER_LIMIT: Duration = Duration::from_secs(90);
/// Virtual time the page gets to poll before the DOM is printed (about
/// three polls at two seconds).
const VIRTUAL_TIME_MS: u32 = 5_000;
const SKIP_ENV: &str = "GSHARE_SKIP_BROWSER_TEST";

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GSHARE_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Where the test leaves its artifacts: `target/dashboard-test/`.
fn artifact_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    // target/<profile>/deps/<exe>
    let target = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .expect("target dir");
    let dir = target.join("dashboard-test");
    std::fs::create_dir_all(&dir).expect("create the artifact dir");
    dir
}

/// `gsharectl up`, its stdout lines arriving on a channel.
struct Up {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Up {
    fn start(args: &[&str]) -> Up {
        let mut child = Command::new(gshare_tests::binary("gsharectl"))
            .arg("up")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn gsharectl up");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                println!("| {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Up {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one starts with `prefix`; returns it.
    fn wait_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + RUN_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                }
                Err(e) => {
                    let _ = self.child.kill();
                    panic!(
                        "no line {prefix:?} ({e}); output so far:\n{}",
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    /// SIGTERM, then waits for a clean exit.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + RUN_LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("gsharectl up still running after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.seen.push(l);
        }
        assert!(
            status.success(),
            "gsharectl up failed:\n{}",
            self.seen.join("\n")
        );
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs Chromium headless on `url` with `extra` arguments; its stdout.
fn run_chromium(bin: &Path, url: &str, extra: &[String]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={VIRTUAL_TIME_MS}"))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let mut out = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let deadline = Instant::now() + BROWSER_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait chromium") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium ran over {BROWSER_LIMIT:?} on {url}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = reader.join().unwrap_or_default();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        panic!("chromium exited {status} on {url}:\n{err}");
    }
    stdout
}

/// The DOM of `url` after the page's script ran.
fn dump_dom(bin: &Path, url: &str) -> String {
    let dom = run_chromium(bin, url, &["--dump-dom".to_string()]);
    assert!(dom.contains("<body"), "no DOM from chromium:\n{dom}");
    dom
}

/// The attributes of every element whose `class` attribute has `class`
/// among its words (Chromium prints attributes as `name="value"`).
fn elements(dom: &str, class: &str) -> Vec<BTreeMap<String, String>> {
    let mut out = Vec::new();
    let mut rest = dom;
    while let Some(start) = rest.find('<') {
        rest = &rest[start + 1..];
        let Some(end) = rest.find('>') else { break };
        let tag = &rest[..end];
        rest = &rest[end..];
        if tag.starts_with('/') || tag.starts_with('!') {
            continue;
        }
        let attrs = attributes(tag);
        if attrs
            .get("class")
            .is_some_and(|c| c.split_whitespace().any(|w| w == class))
        {
            out.push(attrs);
        }
    }
    out
}

fn attributes(tag: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = tag.split_once(char::is_whitespace).map_or("", |(_, r)| r);
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim().to_string();
        let after = &rest[eq + 2..];
        let Some(close) = after.find('"') else { break };
        let value = after[..close]
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&");
        out.insert(name, value);
        rest = &after[close + 1..];
    }
    out
}

fn num(attrs: &BTreeMap<String, String>, name: &str) -> u64 {
    attrs
        .get(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {name} in {attrs:?}"))
}

fn get(addr: SocketAddr, path: &str, token: &str) -> Value {
    let r = request(
        addr,
        "GET",
        path,
        Some(token),
        None,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(r.status, 200, "GET {path}: {}", r.body);
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("GET {path}: {e}: {}", r.body))
}

/// What the API says, to hold the page against.
struct Truth {
    /// (node, GPU index) → (memory MiB, compute held, memory held).
    gpus: BTreeMap<(String, u64), (u64, u64, u64)>,
    /// Nodes by name → GPU count.
    nodes: BTreeMap<String, u64>,
    /// (tenant, function) → (min_instances, current instances).
    functions: BTreeMap<(String, String), (u64, u64)>,
    /// (tenant, function) → invocations through replicas.
    invocations: BTreeMap<(String, String), u64>,
    /// tenant → bill total.
    bills: BTreeMap<String, u64>,
}

/// Per GPU (node, index) → (compute held, memory held), and per function
/// (tenant, function) → instances, from one `/v1/cluster/state`.
type Holdings = (
    BTreeMap<(String, u64), (u64, u64)>,
    BTreeMap<(String, String), u64>,
);

fn holdings(state: &Value) -> Holdings {
    let mut gpus = BTreeMap::<_, (u64, u64)>::new();
    let mut functions = BTreeMap::new();
    for inst in state["instances"].as_object().expect("instances").values() {
        let key = (
            inst["tenant"].as_str().unwrap().to_string(),
            inst["function"].as_str().unwrap().to_string(),
        );
        *functions.entry(key).or_insert(0) += 1;
        for s in inst["slices"].as_array().expect("slices") {
            let g = (
                s["gpu"]["node"].as_str().unwrap().to_string(),
                s["gpu"]["index"].as_u64().unwrap(),
            );
            let e = gpus.entry(g).or_default();
            e.0 += s["compute_milli"].as_u64().unwrap();
            e.1 += s["memory_mib"].as_u64().unwrap();
        }
    }
    (gpus, functions)
}

/// Every holding the API showed while the page loaded. The demo moves an
/// instance and its autoscaler adds and releases some while the page
/// loads, so a GPU can pass through more than one state between the reads
/// before and after; the page must show one the API showed.
#[derive(Default)]
struct Seen {
    gpus: BTreeMap<(String, u64), BTreeSet<(u64, u64)>>,
    functions: BTreeMap<(String, String), BTreeSet<u64>>,
    /// How many reads the sets come from.
    reads: u32,
    /// Reads that failed (left out).
    failed: u32,
}

impl Seen {
    /// Adds one read. `topology` names every GPU and function, so one that
    /// held nothing is seen holding (0, 0) and one with no instance as 0.
    fn add(&mut self, topology: &Truth, (held, functions): Holdings) {
        for g in topology.gpus.keys() {
            let h = held.get(g).copied().unwrap_or_default();
            self.gpus.entry(g.clone()).or_default().insert(h);
        }
        for f in topology.functions.keys() {
            let n = functions.get(f).copied().unwrap_or_default();
            self.functions.entry(f.clone()).or_default().insert(n);
        }
    }
}

/// Prints the page's DOM while another thread reads `/v1/cluster/state`
/// as fast as it answers, and returns the DOM with every holding seen.
fn dump_dom_watching(
    bin: &Path,
    url: &str,
    addr: SocketAddr,
    operator: &str,
    before: &Truth,
) -> (String, Seen) {
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut seen = Seen::default();
            while !done.load(Ordering::SeqCst) {
                // A read that fails only leaves out what it would have
                // seen (the page is then held to fewer states): it does
                // not fail the test.
                let state = request(
                    addr,
                    "GET",
                    "/v1/cluster/state",
                    Some(operator),
                    None,
                    Duration::from_secs(10),
                )
                .ok()
                .filter(|r| r.status == 200)
                .and_then(|r| serde_json::from_str::<Value>(&r.body).ok());
                match state {
                    Some(state) => {
                        seen.add(before, holdings(&state));
                        seen.reads += 1;
                    }
                    None => seen.failed += 1,
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            seen
        });
        // Stops the watcher even when printing the DOM panics.
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dom = {
            let _done = Done(&done);
            dump_dom(bin, url)
        };
        (dom, watcher.join().expect("the state watcher"))
    })
}

fn truth(addr: SocketAddr, operator: &str) -> Truth {
    let state = get(addr, "/v1/cluster/state", operator);
    let mut gpus = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    for pool in state["topology"]["pools"].as_array().expect("pools") {
        for node in pool["nodes"].as_array().expect("nodes") {
            let name = node["name"].as_str().expect("node name").to_string();
            let mut index = 0;
            for g in node["gpus"].as_array().expect("gpus") {
                for _ in 0..g["count"].as_u64().expect("count") {
                    let mem = g["memory_mib"].as_u64().expect("memory_mib");
                    gpus.insert((name.clone(), index), (mem, 0, 0));
                    index += 1;
                }
            }
            nodes.insert(name, index);
        }
    }
    let mut functions = BTreeMap::new();
    for (tenant, byname) in state["functions"].as_object().expect("functions") {
        for (name, rec) in byname.as_object().expect("by name") {
            let min = rec["spec"]["min_instances"].as_u64().expect("min");
            functions.insert((tenant.clone(), name.clone()), (min, 0));
        }
    }
    let (held, current) = holdings(&state);
    for (g, (compute, memory)) in held {
        let e = gpus.get_mut(&g).expect("GPU of a slice");
        e.1 = compute;
        e.2 = memory;
    }
    for (key, n) in current {
        functions.get_mut(&key).expect("function of an instance").1 = n;
    }
    let activity = get(addr, "/v1/activity", operator);
    let invocations = activity["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .map(|f| {
            (
                (
                    f["tenant"].as_str().unwrap().to_string(),
                    f["function"].as_str().unwrap().to_string(),
                ),
                f["invocations"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut bills = BTreeMap::new();
    for tenant in state["tenants"].as_object().expect("tenants").keys() {
        let b = get(addr, &format!("/v1/tenants/{tenant}/bill"), operator);
        bills.insert(tenant.clone(), b["total"].as_u64().expect("total"));
    }
    Truth {
        gpus,
        nodes,
        functions,
        invocations,
        bills,
    }
}

/// One look at the page, held against the API read just before and after.
struct Look {
    /// (tenant, function) → invocations through replicas on the page.
    invocations: BTreeMap<(String, String), u64>,
    /// tenant → bill total on the page.
    bills: BTreeMap<String, u64>,
}

fn check_operator_page(dom: &str, before: &Truth, seen: &Seen, after: &Truth) -> Look {
    assert!(
        dom.contains("data-mode=\"operator\""),
        "the page did not load as the operator:\n{dom}"
    );
    assert!(
        dom.contains("data-error=\"\""),
        "the page shows an error:\n{dom}"
    );
    // Every node, with its GPUs, and no node the topology lacks.
    let nodes = elements(dom, "node");
    let shown: BTreeSet<&str> = nodes.iter().map(|n| n["data-node"].as_str()).collect();
    let want: BTreeSet<&str> = after.nodes.keys().map(String::as_str).collect();
    assert_eq!(shown, want, "nodes on the page");
    for n in &nodes {
        assert_eq!(
            num(n, "data-gpus"),
            after.nodes[&n["data-node"]],
            "GPUs of {n:?}"
        );
        assert_eq!(n["data-state"], "ready", "{n:?}: every agent heartbeats");
    }
    // Every GPU with its capacity and what its slices hold.
    let gpus = elements(dom, "gpu");
    assert_eq!(gpus.len(), after.gpus.len(), "GPUs on the page");
    for g in &gpus {
        let key = (g["data-node"].clone(), num(g, "data-index"));
        let (mem, compute, held) = after.gpus[&key];
        assert_eq!(num(g, "data-memory-mib"), mem, "{key:?}");
        let page = (
            num(g, "data-compute-held-milli"),
            num(g, "data-memory-held-mib"),
        );
        let b = before.gpus[&key];
        let during = seen.gpus.get(&key).cloned().unwrap_or_default();
        assert!(
            page == (compute, held) || page == (b.1, b.2) || during.contains(&page),
            "{key:?}: page holds {page:?}, the API {:?} (before {:?}, while the page loaded {during:?})",
            (compute, held),
            (b.1, b.2)
        );
        // Heartbeat figures are there (simulated GPUs report no NVML reading).
        assert!(g.contains_key("data-utilization-milli"), "{g:?}");
    }
    // Slices: one per placed slice, each with a tier and a state. The
    // demo's autoscaler may add or release an instance between the two
    // reads (acme/digest scales from and to zero), so the page holds at
    // least the fewer of the two counts.
    let slices = elements(dom, "slice");
    let placed = |t: &Truth| -> u64 { t.functions.values().map(|(_, c)| c).sum() };
    let fewest = placed(before).min(placed(after));
    assert!(
        slices.len() as u64 >= fewest,
        "{} slices for at least {fewest} instances (before {}, after {})",
        slices.len(),
        placed(before),
        placed(after)
    );
    for s in &slices {
        assert!(
            ["resident", "loading", "swapped-out"].contains(&s["data-state"].as_str()),
            "{s:?}"
        );
    }
    // Every function with desired and current instances and its counts.
    let rows = elements(dom, "function");
    let shown: BTreeSet<(String, String)> = rows
        .iter()
        .map(|r| (r["data-tenant"].clone(), r["data-function"].clone()))
        .collect();
    let want: BTreeSet<(String, String)> = after.functions.keys().cloned().collect();
    assert_eq!(shown, want, "functions on the page");
    let mut invocations = BTreeMap::new();
    for r in &rows {
        let key = (r["data-tenant"].clone(), r["data-function"].clone());
        let (min, current) = after.functions[&key];
        assert_eq!(num(r, "data-desired"), min, "{key:?}");
        let was = before.functions.get(&key).map_or(current, |(_, c)| *c);
        let shown = num(r, "data-current");
        let during = seen.functions.get(&key).cloned().unwrap_or_default();
        assert!(
            (was.min(current)..=was.max(current)).contains(&shown) || during.contains(&shown),
            "{key:?}: page shows {shown} instances, the API {was} before and {current} after \
             ({during:?} while the page loaded)"
        );
        let n = num(r, "data-invocations");
        let lo = before.invocations.get(&key).copied().unwrap_or(0);
        let hi = after.invocations.get(&key).copied().unwrap_or(0);
        assert!((lo..=hi).contains(&n), "{key:?}: page {n}, API {lo}..{hi}");
        assert!(
            num(r, "data-within") + num(r, "data-late") + num(r, "data-failed") == n,
            "{r:?}"
        );
        invocations.insert(key, n);
    }
    // Every tenant's bill.
    let mut bills = BTreeMap::new();
    for t in elements(dom, "tenant") {
        let name = t["data-tenant"].clone();
        let total = num(&t, "data-total");
        let (lo, hi) = (before.bills[&name], after.bills[&name]);
        assert!(
            (lo..=hi).contains(&total),
            "{name}: page {total}, API {lo}..{hi}"
        );
        bills.insert(name, total);
    }
    assert_eq!(
        bills.keys().collect::<Vec<_>>(),
        after.bills.keys().collect::<Vec<_>>()
    );
    assert!(
        !elements(dom, "event").is_empty(),
        "no events (placements at least)"
    );
    Look { invocations, bills }
}

#[test]
fn the_dashboard_shows_the_region_live_in_a_browser() {
    let Some(browser) = chromium() else {
        if std::env::var_os(SKIP_ENV).is_some_and(|v| v == "1") {
            eprintln!("SKIPPED: no chromium on PATH and {SKIP_ENV}=1");
            return;
        }
        panic!(
            "chromium not found on PATH: install Debian's chromium (apt-get install -y chromium; \
             .ci/run does), name a binary with GSHARE_CHROMIUM=<path>, or set {SKIP_ENV}=1 to \
             skip this test locally"
        );
    };
    let started = Instant::now();
    let mut up = Up::start(&["--load-s", "45"]);
    let line = up.wait_line("dashboard: ");
    // The URL is followed by whitespace.
    let url = line["dashboard: ".len()..]
        .split_whitespace()
        .next()
        .expect("a URL")
        .to_string();
    assert!(line.len() > "dashboard: ".len() + url.len(), "{line:?}");
    let (base, operator) = url
        .split_once("/#token=")
        .expect("http://<replica>/#token=<t>");
    let addr: SocketAddr = base
        .strip_prefix("http://")
        .expect("http://")
        .parse()
        .expect("ip:port");
    let ingress: Vec<SocketAddr> = {
        let mut v = Vec::new();
        while v.len() < 4 {
            let l = up.wait_line("up: agent ");
            let mut w = l.split_whitespace();
            w.find(|x| *x == "ingress");
            v.push(w.next().expect("ingress").parse().expect("ingress addr"));
        }
        v
    };
    up.wait_line("up: invocation load");
    std::thread::sleep(Duration::from_secs(2));

    // `/` itself is static: no node, GPU or function name without a token.
    let plain = request(addr, "GET", "/", None, None, Duration::from_secs(10)).expect("GET /");
    assert_eq!(plain.status, 200);
    assert!(plain.body.contains("<script src=\"/dashboard/app.js\">"));

    let before = truth(addr, operator);
    for name in before
        .nodes
        .keys()
        .chain(before.functions.keys().map(|(_, f)| f))
        .chain(["sim-gpu-16g".to_string()].iter())
    {
        assert!(!plain.body.contains(name.as_str()), "GET / names {name}");
    }
    let (dom1, seen) = dump_dom_watching(&browser, &url, addr, operator, &before);
    std::fs::write(artifact_dir().join("look-1.html"), &dom1).expect("save the DOM");
    let after = truth(addr, operator);
    let first = check_operator_page(&dom1, &before, &seen, &after);
    println!(
        "first look: {} nodes, {} GPUs, {} functions ({} reads of the state while the page \
         loaded, {} failed); invocations via replicas {:?}; bills {:?}",
        after.nodes.len(),
        after.gpus.len(),
        after.functions.len(),
        seen.reads,
        seen.failed,
        first.invocations,
        first.bills
    );

    std::thread::sleep(Duration::from_secs(4));
    let before = truth(addr, operator);
    let (dom2, seen) = dump_dom_watching(&browser, &url, addr, operator, &before);
    std::fs::write(artifact_dir().join("look-2.html"), &dom2).expect("save the DOM");
    let after = truth(addr, operator);
    let second = check_operator_page(&dom2, &before, &seen, &after);
    println!(
        "second look: {} reads of the state while the page loaded, {} failed",
        seen.reads, seen.failed
    );
    let sum = |l: &Look| l.invocations.values().sum::<u64>();
    assert!(
        sum(&second) > sum(&first),
        "invocations did not move: {:?} then {:?}",
        first.invocations,
        second.invocations
    );
    assert!(
        second.bills.values().sum::<u64>() > first.bills.values().sum::<u64>(),
        "bills did not move: {:?} then {:?}",
        first.bills,
        second.bills
    );

    let shot = artifact_dir().join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    run_chromium(
        &browser,
        &url,
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1400,2200".to_string(),
        ],
    );
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 10_000,
        "screenshot {} is {size} bytes",
        shot.display()
    );
    println!("dashboard screenshot: {}", shot.display());

    // A tenant's link: its own functions only, and no load figures.
    let issued = request(
        addr,
        "POST",
        "/v1/tenants/acme/tokens",
        Some(operator),
        Some("{}"),
        Duration::from_secs(10),
    )
    .expect("issue a token");
    assert!(issued.status < 300, "{}", issued.body);
    let secret = serde_json::from_str::<Value>(&issued.body).expect("json")["token"]
        .as_str()
        .expect("token")
        .to_string();
    let base_url = format!("{base}/#token={secret}");
    let dom = dump_dom(&browser, &base_url);
    std::fs::write(artifact_dir().join("tenant.html"), &dom).expect("save the DOM");
    assert!(dom.contains("data-mode=\"tenant\""), "{dom}");
    assert!(dom.contains("data-error=\"\""), "{dom}");
    let rows = elements(&dom, "function");
    let mine: BTreeSet<String> = after
        .functions
        .keys()
        .filter(|(t, _)| t == "acme")
        .map(|(_, f)| f.clone())
        .collect();
    let shown: BTreeSet<String> = rows.iter().map(|r| r["data-function"].clone()).collect();
    assert_eq!(shown, mine, "acme's functions");
    for (t, f) in after.functions.keys().filter(|(t, _)| t != "acme") {
        assert!(
            !dom.contains(&format!("data-function=\"{f}\"")) || mine.contains(f),
            "acme's page shows {t}/{f}"
        );
    }
    for g in elements(&dom, "gpu") {
        assert!(!g.contains_key("data-utilization-milli"), "{g:?}");
    }
    for s in elements(&dom, "slice") {
        if let Some(t) = s.get("data-tenant") {
            assert_eq!(t, "acme", "{s:?}");
        }
    }
    let tenants: Vec<String> = elements(&dom, "tenant")
        .iter()
        .map(|t| t["data-tenant"].clone())
        .collect();
    assert_eq!(tenants, vec!["acme".to_string()]);

    // The other routes still answer as before: the agents' ingress has no page.
    for a in &ingress {
        let r = request(*a, "GET", "/", None, None, Duration::from_secs(10))
            .expect("GET / on an agent");
        assert_eq!(r.status, 404, "{a}: {}", r.body);
        assert!(r.body.contains("unknown_route"), "{a}: {}", r.body);
        let h =
            request(*a, "GET", "/healthz", None, None, Duration::from_secs(10)).expect("healthz");
        assert_eq!(h.status, 200);
    }
    for path in ["/healthz", "/v1/cluster", "/metrics"] {
        let r = request(addr, "GET", path, None, None, Duration::from_secs(10)).expect(path);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    let r = request(
        addr,
        "GET",
        "/v1/activity",
        None,
        None,
        Duration::from_secs(10),
    )
    .expect("activity");
    assert_eq!(r.status, 401, "{}", r.body);
    // Another method on `/` is an unknown route, in the one error shape.
    let r = request(addr, "POST", "/", None, Some("{}"), Duration::from_secs(10)).expect("POST /");
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("unknown_route"), "{}", r.body);
    up.stop();
    println!(
        "dashboard test: {:.0} s (gsharectl up included)",
        started.elapsed().as_secs_f64()
    );
}
