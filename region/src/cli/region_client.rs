//! What the tenant/operator commands share: where the region is
//! (`--region`, `GSHARE_REGION`; `https://…` with `--ca`/`GSHARE_CA`,
//! a bare `host:port` is http), who is asking (`--token`,
//! `GSHARE_TOKEN`), `--json`, retries while no leader is known, and
//! `{"error": {"code", "message"}}` answers turned into errors.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail};
use serde_json::Value;

use crate::http_client::{request_to, HttpTarget};

const TIMEOUT: Duration = Duration::from_secs(30);
const ATTEMPTS: u32 = 10;

/// `--region`, `--token`, `--json`, shared by the region commands.
#[derive(Debug, Clone, clap::Args)]
pub struct RegionArgs {
    /// Any replica's HTTP address, `http://host:port`, `https://host:port`
    /// or `host:port` (http) (default: `$GSHARE_REGION`, else `127.0.0.1:8101`).
    /// (`--at` is an alias, kept from `gsharectl cluster`.)
    #[arg(long, global = true, alias = "at")]
    pub region: Option<String>,
    /// The CA certificate (PEM) an `https://` region's certificate must
    /// chain to, e.g. the operator's `ca.pem` (default: `$GSHARE_CA`).
    #[arg(long, global = true)]
    pub ca: Option<PathBuf>,
    /// Bearer token: the operator's or a tenant's (default: `$GSHARE_TOKEN`).
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// Print the JSON answer instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

impl RegionArgs {
    /// The replica to talk to (`--region`, `$GSHARE_REGION`, the default).
    pub(crate) fn target(&self) -> anyhow::Result<HttpTarget> {
        let raw = self
            .region
            .clone()
            .or_else(|| std::env::var("GSHARE_REGION").ok())
            .unwrap_or_else(|| "127.0.0.1:8101".into());
        let ca = self
            .ca
            .clone()
            .or_else(|| std::env::var_os("GSHARE_CA").map(PathBuf::from));
        HttpTarget::parse(&raw, ca.as_deref()).map_err(|e| anyhow!("--region {e}"))
    }

    /// The bearer token (`--token`, `$GSHARE_TOKEN`).
    pub(crate) fn token(&self) -> anyhow::Result<String> {
        self.token
            .clone()
            .or_else(|| std::env::var("GSHARE_TOKEN").ok())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| anyhow!("give --token or set GSHARE_TOKEN"))
    }

    /// Sends one request; retries while the region answers 503 (no leader).
    /// A non-2xx answer becomes an error `code: message`.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        self.call_within(method, path, body, TIMEOUT)
    }

    /// [`RegionArgs::call`] waiting up to `timeout` for each answer (a
    /// request the region works on for long, such as a move).
    pub fn call_within(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> anyhow::Result<Value> {
        let target = self.target()?;
        let token = self.token()?;
        let body = body.map(Value::to_string);
        let mut attempt = 0;
        loop {
            let r = request_to(
                &target,
                method,
                path,
                Some(&token),
                body.as_deref(),
                timeout,
            )?;
            let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::String(r.body.clone()));
            if (200..300).contains(&r.status) {
                return Ok(v);
            }
            attempt += 1;
            if r.status == 503 && attempt < ATTEMPTS {
                std::thread::sleep(Duration::from_millis(300));
                continue;
            }
            let e = &v["error"];
            bail!(
                "{} {}: {}",
                r.status,
                e["code"].as_str().unwrap_or("error"),
                e["message"].as_str().unwrap_or(&r.body)
            );
        }
    }

    /// Sends one request with `headers` and a raw `body` and returns the
    /// answer as it came (any status), for `function invoke`. Not retried:
    /// the caller passes an `Idempotency-Key` when it retries.
    pub fn send_raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<crate::http_client::HttpAnswer> {
        let target = self.target()?;
        let auth = format!("Bearer {}", self.token()?);
        let mut all = vec![("Authorization", auth.as_str())];
        all.extend_from_slice(headers);
        Ok(crate::http_client::send(
            &target,
            method,
            path,
            &all,
            body,
            TIMEOUT,
            crate::http_client::MAX_REPLY_BYTES,
        )?)
    }

    /// The price list's currency and how many units make one, for showing
    /// money (`None` when the region has no price list or refuses).
    pub fn currency(&self) -> Option<(String, u64)> {
        let v = self.call("GET", "/v1/prices", None).ok()?;
        Some((
            v["currency"].as_str()?.to_string(),
            v["units_per_currency"].as_u64()?,
        ))
    }

    /// Prints `v` as JSON with `--json`, else as `table(v)`.
    pub fn show(&self, v: &Value, table: impl FnOnce(&Value) -> Vec<Vec<String>>) {
        if self.json {
            println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
        } else {
            print_table(&table(v));
        }
    }
}

/// Prints rows as left-aligned columns (first row: the header). A row of
/// one cell in a table of several columns (a footer such as a total) is
/// printed as it is and does not widen the first column.
pub fn print_table(rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter(|r| cols == 1 || r.len() > 1)
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if r.len() == 1 {
                    s.clone()
                } else {
                    format!("{s:<w$}", w = widths[i])
                }
            })
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
}

/// A JSON value as table text (strings unquoted, null as `-`).
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Rows of `key: value` for an object answer.
pub fn key_values(v: &Value) -> Vec<Vec<String>> {
    match v {
        Value::Object(m) if m.len() == 1 && m.values().all(Value::is_object) => {
            let (kind, inner) = m
                .iter()
                .next()
                .map(|(k, v)| (k.clone(), v.clone()))
                .unwrap_or_default();
            let mut rows = vec![vec!["outcome".into(), kind]];
            rows.extend(key_values(&inner));
            rows
        }
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                let text = match v.as_u64() {
                    Some(ms) if super::human::is_time_key(k) => super::human::utc(ms),
                    _ => cell(v),
                };
                vec![format!("{k}:"), text]
            })
            .collect(),
        other => vec![vec![cell(other)]],
    }
}
