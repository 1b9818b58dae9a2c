//! `gsharectl` as an operator and a tenant use it, against real replica
//! processes: `function update` (a reshaping update replaces the
//! instances, another keeps them), the operator's view of a tenant's
//! functions, `node describe`, `tenant rm` (refused while the tenant has
//! functions, `--force` deletes them; its bill and usage stay readable, its
//! token stops, its name is not reused), and human output (money in
//! currency units, discounts in percent, no column blown up by a footer).

use std::process::Command;
use std::time::{Duration, Instant};

use gshare_tests::{TestRegion, TOKEN};
use serde_json::Value;

struct Ctl {
    region: String,
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Ctl {
    fn run(&self, token: &str, args: &[&str]) -> Out {
        let out = Command::new(gshare_tests::binary("gsharectl"))
            .args(args)
            .env("GSHARE_REGION", &self.region)
            .env("GSHARE_TOKEN", token)
            .env_remove("GSHARE_CA")
            .output()
            .expect("gsharectl");
        Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs and expects success; the stdout.
    fn ok(&self, token: &str, args: &[&str]) -> String {
        let o = self.run(token, args);
        assert!(o.ok, "gsharectl {args:?}: {}{}", o.stdout, o.stderr);
        o.stdout
    }

    fn json(&self, token: &str, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.ok(token, &all);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    }

    /// Retries `args` until `f` holds on its JSON answer.
    fn until(&self, token: &str, args: &[&str], f: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut all = args.to_vec();
            all.push("--json");
            let o = self.run(token, &all);
            if let Ok(v) = serde_json::from_str::<Value>(&o.stdout) {
                if o.ok && f(&v) {
                    return v;
                }
            }
            assert!(
                Instant::now() < deadline,
                "timed out: {args:?}: {}{}",
                o.stdout,
                o.stderr
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

const FUNCTION: &str = r#"name = "hello"
runtime = "pytorch"
memory_mib = 3000
compute_milli = 400
tier = "guaranteed"
deadline_ms = 2000
pool = "center"
min_instances = 1
"#;

fn instances(f: &Value) -> Vec<(u64, u64)> {
    f["instances"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|i| {
            (
                i["instance"].as_u64().unwrap_or(0),
                i["slices"][0]["memory_mib"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

#[test]
fn update_rm_and_the_operators_view_of_a_tenant() {
    let mut region = TestRegion::new(3).expect("region");
    for id in 1..=3 {
        region.start(id, id == 1).expect("start");
    }
    region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    // A follower's address: every command works against any replica.
    let ctl = Ctl {
        region: format!("http://{}", region.http(2)),
    };
    ctl.until(TOKEN, &["tenant", "ls"], |v| {
        v.as_array().is_some_and(|a| a.len() == 2)
    });
    let issued = ctl.json(TOKEN, &["token", "issue", "acme"]);
    let acme = issued["token"].as_str().expect("token").to_string();
    let file = region.root().join("hello.toml");
    std::fs::write(&file, FUNCTION).unwrap();
    let file = file.to_str().unwrap();
    ctl.ok(&acme, &["function", "deploy", "-f", file, "--no-wait"]);

    // The operator reads the tenant's functions; without --tenant the
    // operator still has none of its own.
    let listed = ctl.until(TOKEN, &["function", "ls", "--tenant", "acme"], |v| {
        v.as_array().is_some_and(|a| a.len() == 1)
    });
    assert_eq!(listed[0]["spec"]["name"], "hello");
    let o = ctl.run(TOKEN, &["function", "ls"]);
    assert!(!o.ok && o.stderr.contains("403"), "{}", o.stderr);
    let f = ctl.until(
        TOKEN,
        &["function", "describe", "hello", "--tenant", "acme"],
        |v| instances(v).len() == 1,
    );
    let [(first, 3000)] = instances(&f)[..] else {
        panic!("{f}")
    };
    let node = f["instances"][0]["slices"][0]["gpu"]["node"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(f["instances"][0]["state"].is_string(), "{f}");

    // node describe: the instance on its GPU, in the table and in JSON.
    let table = ctl.ok(TOKEN, &["node", "describe", &node]);
    assert!(table.contains(&format!("acme/hello #{first}")), "{table}");
    let n = ctl.json(TOKEN, &["node", "describe", &node]);
    assert_eq!(n["pool"], "center");
    let on_gpus: Vec<u64> = n["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["instances"].as_array().cloned().unwrap_or_default())
        .map(|i| i["instance"].as_u64().unwrap())
        .collect();
    assert_eq!(on_gpus, [first]);
    let o = ctl.run(TOKEN, &["node", "describe", "no-such-node"]);
    assert!(!o.ok && o.stderr.contains("404"), "{}", o.stderr);

    // A reshaping update (memory) replaces the instance (make-before-break:
    // the old one is outgoing until the new one is placed and taken) …
    std::fs::write(file, FUNCTION.replace("3000", "4000")).unwrap();
    let u = ctl.json(&acme, &["function", "update", "-f", file, "--no-wait"]);
    assert_eq!(u["version"], 2, "{u}");
    assert_eq!(u["released"], serde_json::json!([]), "{u}");
    assert_eq!(u["replacing"], serde_json::json!([first]), "{u}");
    let f = ctl.until(&acme, &["function", "describe", "hello"], |v| {
        instances(v).len() == 1 && instances(v)[0].1 == 4000
    });
    assert_eq!(f["version"], 2);
    let second = instances(&f)[0].0;
    assert_ne!(second, first);
    // … another change (the deadline) keeps it.
    std::fs::write(
        file,
        FUNCTION
            .replace("3000", "4000")
            .replace("deadline_ms = 2000", "deadline_ms = 3000"),
    )
    .unwrap();
    let u = ctl.json(&acme, &["function", "update", "-f", file, "--no-wait"]);
    assert_eq!(u["version"], 3, "{u}");
    assert_eq!(u["released"], serde_json::json!([]), "{u}");
    let f = ctl.until(&acme, &["function", "describe", "hello"], |v| {
        v["version"] == 3
    });
    assert_eq!(instances(&f), [(second, 4000)]);
    assert_eq!(f["spec"]["deadline_ms"], 3000);
    // An update of a function nobody deployed is a 404 and deploys nothing.
    std::fs::write(file, FUNCTION.replace("\"hello\"", "\"other\"")).unwrap();
    let o = ctl.run(&acme, &["function", "update", "-f", file, "--no-wait"]);
    assert!(
        !o.ok && o.stderr.contains("unknown_function"),
        "{}",
        o.stderr
    );
    let listed = ctl.json(&acme, &["function", "ls"]);
    assert_eq!(listed.as_array().unwrap().len(), 1);

    // tenant rm: refused while it has functions, then --force.
    let o = ctl.run(TOKEN, &["tenant", "rm", "acme"]);
    assert!(
        !o.ok && o.stderr.contains("tenant_has_functions"),
        "{}",
        o.stderr
    );
    assert_eq!(
        ctl.json(&acme, &["function", "ls"])
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let bill_before = ctl.json(TOKEN, &["bill", "--tenant", "acme"]);
    let gone = ctl.json(TOKEN, &["tenant", "rm", "acme", "--force"]);
    assert_eq!(
        gone["TenantDeleted"]["functions"],
        serde_json::json!(["hello"])
    );
    assert_eq!(
        gone["TenantDeleted"]["released"],
        serde_json::json!([second])
    );
    let tenants = ctl.json(TOKEN, &["tenant", "ls"]);
    let names: Vec<&str> = tenants
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["globex"]);
    let o = ctl.run(&acme, &["function", "ls"]);
    assert!(!o.ok && o.stderr.contains("401"), "{}", o.stderr);
    assert_eq!(ctl.json(TOKEN, &["bill", "--tenant", "acme"]), bill_before);
    assert!(ctl.json(TOKEN, &["usage", "--tenant", "acme"]).is_array());
    let o = ctl.run(TOKEN, &["tenant", "create", "acme"]);
    assert!(!o.ok && o.stderr.contains("duplicate_name"), "{}", o.stderr);
    let o = ctl.run(TOKEN, &["tenant", "rm", "acme"]);
    assert!(!o.ok && o.stderr.contains("unknown_tenant"), "{}", o.stderr);

    // Human output: money in the currency, discounts in percent, and no
    // column padded to the width of a footer line.
    let prices = ctl.ok(TOKEN, &["price", "show"]);
    assert!(prices.contains(" USD"), "{prices}");
    assert!(prices.contains("guaranteed 15.00 %"), "{prices}");
    let bill = ctl.ok(TOKEN, &["bill", "--tenant", "acme"]);
    assert!(bill.contains("total 0.000000 USD"), "{bill}");
    for out in [&prices, &bill] {
        for line in out.lines() {
            assert!(!line.contains(&" ".repeat(12)), "padded: {line:?}\n{out}");
        }
    }
}
