//! Fuzz targets, on stable (proptest): every parser of untrusted bytes
//! gets arbitrary input and structure-aware mutations of valid input, and
//! must answer with a value or an error, never a panic, a hang or an
//! allocation the input did not pay for.
//!
//! Targets: the frame decoder (agent and peer wire), every TOML config
//! parser (topology, tenants, agent with its `[runtimes]`, price list,
//! serving parameters, replica, function files, runtime templates), the
//! CSV trace readers, the agent's HTTP response parser, and the region's
//! JSON bodies through a real replica (deserialize, validate, apply).
//!
//! `GSHARE_FUZZ_CASES=1000000 cargo test --release -p gshare-tests --test fuzz`
//! runs a long campaign (see docs/fuzzing.md).

use gshare_core::config::{AgentConfig, ConfigError, PriceList, Tenants, Topology};
use gshare_core::model::{
    FunctionSpec, GpuId, LatencyProfile, NodeId, PoolKind, PoolPreference, Runtime, Slice,
    TenantId, Tier,
};
use gshare_core::placement::{parse_node_csv, parse_pod_csv, GpuModels};
use gshare_core::protocol::{
    AgentFrames, AgentMessage, AgentMessageV1, AgentWire, AssignedInstance, Assignment,
    FrameDecoder, FrameError, InvokeOutcome, InvokeReply, InvokeRequest, NodeGpu, PeerFrames,
    PeerWire, RegionMessage, RegionMessageV1, Register, TenantTokens, TokenDigests, Wire,
    AGENT_FRAME_BYTES,
};
use gshare_core::sim::serving::{ServingParams, ServingTrace};
use gshare_core::state::{AgentId, InstanceId, UsageRecord};
use gshare_edge::runtime::process::{read_response, RuntimeTemplate};
use gshare_region::config::ReplicaConfig;
use gshare_region::wire::{PeerReply, PeerRequest};
use gshare_tests::fuzz::{
    arbitrary_bytes, arbitrary_text, config, mutated_bytes, mutated_json, mutated_text,
};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use serde_json::{json, Value};
use std::time::Duration;

const LOCAL_TOPOLOGY: &str = include_str!("../../configs/local/topology.toml");
const EXAMPLE_TOPOLOGY: &str = include_str!("../../configs/examples/topology.toml");
const LOCAL_TENANTS: &str = include_str!("../../configs/local/tenants.toml");
const EXAMPLE_TENANTS: &str = include_str!("../../configs/examples/tenants.toml");
const LOCAL_AGENT: &str = include_str!("../../configs/local/agent-local-c1.toml");
const EXAMPLE_AGENT: &str = include_str!("../../configs/examples/agent-sh-l4-0.toml");
const FUNCTION_FILE: &str = include_str!("../../configs/examples/function.toml");
const TEMPLATES: &[&str] = &[
    include_str!("../../configs/examples/runtimes/pytorch.toml"),
    include_str!("../../configs/examples/runtimes/sglang.toml"),
    include_str!("../../configs/examples/runtimes/tf-serving.toml"),
    include_str!("../../configs/examples/runtimes/vllm.toml"),
];
const REPLICA: &str = r#"id = 1
raft_addr = "127.0.0.1:7101"
http_addr = "127.0.0.1:8101"
data_dir = "data/r1"
topology = "topology.toml"
tenants = "tenants.toml"
operator_token = "change-me"
snapshot_every = 20000
keep_logs = 1000

[tls]
ca_cert = "certs/ca.pem"
cert = "certs/r1.pem"
key = "certs/r1.key"

[[peers]]
id = 2
raft_addr = "127.0.0.1:7102"
http_addr = "127.0.0.1:8102"
"#;
const NODE_CSV: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
openb-node-0000,64000,262144,0,\n\
openb-node-0001,96000,786432,8,G3\n\
openb-node-0002,32000,131072,2,T4\n";
const POD_CSV: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0\n\
openb-pod-0001,6000,12288,1,460,V100M16|V100M32,LS,Running,427061,12902960,427061\n\
openb-pod-0002,4000,15258,2,1000,,BE,Succeeded,3,1035,3\n";
const GENAI_CSV: &str = "gmt_create,predict_type,predict_status,exec_time_seconds,groupId,prompt_length,negative_prompt_length,num_images_per_prompt,num_inference_steps,checkpoint_model_version_id,num_lora\n\
2024-11-15 16:57:52,TXT_2_IMG,SUCCEED,32.0,G0000,63.0,26.0,1.0,30.0,M0000,0\n\
2024-11-15 16:57:50,TXT_2_IMG,FAILED,0.5,G0001,93.0,,1.0,40.0,M0001,0\n";
const AZURE_CSV: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
2023-11-16 18:17:03.9799600,4808,10\n\
2023-11-16 18:17:04.0319600,3180,8\n";

/// Every issue of a config error points inside the file (line and column
/// from 1, line at most one past the last), or nowhere.
fn issues_point_into(src: &str, e: &ConfigError) -> Result<(), TestCaseError> {
    prop_assert!(!e.issues.is_empty(), "an error without issues: {e}");
    let lines = u32::try_from(src.lines().count()).unwrap_or(u32::MAX);
    for i in &e.issues {
        if let Some(line) = i.line {
            prop_assert!(
                (1..=lines.saturating_add(1)).contains(&line),
                "{i:?} in {lines} lines"
            );
        }
        if let Some(column) = i.column {
            prop_assert!(column >= 1, "{i:?}");
        }
    }
    Ok(())
}

/// Runs every config parser of core on `src`.
fn core_configs(src: &str) -> Result<(), TestCaseError> {
    if let Err(e) = Topology::from_toml("fuzz.toml", src) {
        issues_point_into(src, &e)?;
    }
    if let Err(e) = Tenants::from_toml("fuzz.toml", src) {
        issues_point_into(src, &e)?;
    }
    if let Err(e) = AgentConfig::from_toml("fuzz.toml", src) {
        issues_point_into(src, &e)?;
    }
    if let Err(e) = PriceList::from_toml("fuzz.toml", src) {
        issues_point_into(src, &e)?;
    }
    let _ = ServingParams::from_toml("fuzz.toml", src);
    Ok(())
}

/// Runs every config parser outside core on `src`.
fn binary_configs(src: &str) -> Result<(), TestCaseError> {
    if let Err(problems) = ReplicaConfig::parse(src, std::path::Path::new("/nonexistent")) {
        prop_assert!(!problems.is_empty());
    }
    if let Ok(body) = gshare_region::cli::function::parse("fuzz.toml", src) {
        // What the file reader accepts, the API's body takes (strict_pool with a pool).
        prop_assert!(body.into_spec(TenantId("acme".into())).is_ok());
    }
    let _ = RuntimeTemplate::parse(src, "fuzz.toml");
    Ok(())
}

fn config_seed() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just(LOCAL_TOPOLOGY),
        Just(EXAMPLE_TOPOLOGY),
        Just(LOCAL_TENANTS),
        Just(EXAMPLE_TENANTS),
        Just(LOCAL_AGENT),
        Just(EXAMPLE_AGENT),
        Just(FUNCTION_FILE),
        Just(REPLICA),
        Just(TEMPLATES[0]),
        Just(TEMPLATES[1]),
        Just(TEMPLATES[2]),
        Just(TEMPLATES[3]),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn config_parsers_take_arbitrary_text(src in arbitrary_text()) {
        core_configs(&src)?;
        binary_configs(&src)?;
    }

    #[test]
    fn config_parsers_take_mutated_config_files(
        src in config_seed().prop_flat_map(mutated_text)
    ) {
        core_configs(&src)?;
        binary_configs(&src)?;
    }
}

fn spec() -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: TenantId("acme".into()),
        name: "resnet".into(),
        runtime: Runtime::Pytorch,
        memory_mib: 2048,
        compute_milli: 250,
        tier: Tier::Oversubscribed,
        deadline_ms: 200,
        pool: PoolPreference::Any,
        min_instances: 1,
        max_instances: 2,
        idle_timeout_s: 60,
        latency: LatencyProfile {
            full_gpu_us: 40_000,
            saturation_milli: 1000,
        },
    }
}

/// Valid agent-wire frames, both directions.
fn agent_wire_frames() -> Vec<Vec<u8>> {
    let agent = AgentId("n1".into());
    let agents = [
        AgentMessage::v1(AgentMessageV1::Register(Register {
            agent: agent.clone(),
            node: NodeId("n1".into()),
            pool: "center".into(),
            version: "0.1.0".into(),
            gpus: vec![NodeGpu {
                index: 0,
                model: "A100-SXM4-80GB".into(),
                memory_mib: 81920,
            }],
            ingress: "127.0.0.1:9000".into(),
        })),
        AgentMessage::v1(AgentMessageV1::Usage {
            agent,
            records: vec![UsageRecord {
                seq: 1,
                tenant: TenantId("acme".into()),
                function: "resnet".into(),
                tier: Tier::Oversubscribed,
                gpu_model: "A100-SXM4-80GB".into(),
                pool_kind: PoolKind::Center,
                compute_milli_gpu_ms: 100,
                memory_mib_ms: 200,
                invocations: 3,
                end_ms: 300,
            }],
        }),
        AgentMessage::v1(AgentMessageV1::InvokeReply(InvokeReply {
            id: 5,
            outcome: InvokeOutcome::Done {
                body: b"ok".to_vec(),
                queued_us: 1,
                service_us: 2,
            },
        })),
    ];
    let regions = [
        RegionMessage::v1(RegionMessageV1::Assignment(Assignment {
            applied_index: 42,
            instances: vec![AssignedInstance {
                instance: InstanceId(3),
                spec: spec(),
                version: 1,
                slices: vec![Slice {
                    gpu: GpuId {
                        node: NodeId("n1".into()),
                        index: 0,
                    },
                    compute_milli: 250,
                    memory_mib: 2048,
                }],
            }],
        })),
        RegionMessage::v1(RegionMessageV1::Tokens(TokenDigests {
            applied_index: 42,
            tenants: vec![TenantTokens {
                tenant: TenantId("acme".into()),
                digests: vec!["ab".repeat(32)],
            }],
        })),
        RegionMessage::v1(RegionMessageV1::Invoke(InvokeRequest {
            id: 4,
            tenant: TenantId("acme".into()),
            function: "resnet".into(),
            deadline_ms: Some(50),
            body: vec![1, 2, 3],
        })),
        RegionMessage::v1(RegionMessageV1::UsageAck { seqs: vec![1, 2] }),
    ];
    let mut frames: Vec<Vec<u8>> = agents
        .iter()
        .map(|m| AgentFrames::encode(m).unwrap())
        .collect();
    frames.extend(regions.iter().map(|m| AgentFrames::encode(m).unwrap()));
    frames
}

/// Feeds `bytes` to a decoder in pieces of `piece` bytes, popping messages
/// of type `T`; checks the decoder's memory and its failure behaviour.
fn decode_stream<T, W: Wire>(bytes: &[u8], piece: usize) -> Result<(), TestCaseError>
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    let mut dec = FrameDecoder::<W>::default();
    let mut pushed = 0usize;
    for chunk in bytes.chunks(piece.max(1)) {
        pushed += chunk.len();
        if dec.push(chunk).is_err() {
            prop_assert_eq!(dec.buffered(), 0, "a failed decoder holds no bytes");
            prop_assert!(
                dec.next_message::<T>().is_err(),
                "a failed decoder stays failed"
            );
            return Ok(());
        }
        prop_assert!(dec.buffered() <= pushed);
        loop {
            match dec.next_message::<T>() {
                Ok(Some(m)) => {
                    // What decodes re-encodes, within the limit, to the same message.
                    let again = gshare_core::protocol::Frames::<W>::encode(&m)
                        .map_err(|e| TestCaseError::fail(format!("re-encode: {e}")))?;
                    let back: T = gshare_core::protocol::Frames::<W>::decode_payload(&again[4..])
                        .map_err(|e| TestCaseError::fail(format!("re-decode: {e}")))?;
                    prop_assert_eq!(back, m);
                }
                Ok(None) => break,
                Err(e) => {
                    let known = matches!(
                        e,
                        FrameError::Oversized { .. } | FrameError::Malformed { .. }
                    );
                    prop_assert!(known, "unexpected error {:?}", e);
                    prop_assert_eq!(dec.buffered(), 0);
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

/// A valid frame (or two in a row) with bytes edited, and sometimes its
/// length prefix forged.
fn mutated_frames() -> impl Strategy<Value = Vec<u8>> {
    let frames = agent_wire_frames();
    (
        proptest::sample::select(frames.clone()),
        proptest::sample::select(frames),
        any::<bool>(),
        prop_oneof![
            Just(None),
            Just(Some(0u32)),
            Just(Some(u32::MAX)),
            Just(Some(AGENT_FRAME_BYTES as u32)),
            Just(Some(AGENT_FRAME_BYTES as u32 + 1)),
            any::<u32>().prop_map(Some),
        ],
    )
        .prop_flat_map(|(a, b, two, len)| {
            let mut seed = a;
            if two {
                seed.extend(b);
            }
            if let Some(len) = len {
                seed[..4].copy_from_slice(&len.to_be_bytes());
            }
            mutated_bytes(seed)
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_frame_decoder_takes_arbitrary_bytes(
        bytes in arbitrary_bytes(),
        piece in 1usize..64,
    ) {
        decode_stream::<AgentMessage, AgentWire>(&bytes, piece)?;
        decode_stream::<RegionMessage, AgentWire>(&bytes, piece)?;
        let _ = PeerFrames::decode_payload::<PeerRequest>(&bytes);
        let _ = PeerFrames::decode_payload::<PeerReply>(&bytes);
    }

    #[test]
    fn the_frame_decoder_takes_mutated_frames(
        bytes in mutated_frames(),
        piece in prop_oneof![Just(usize::MAX), 1usize..32],
    ) {
        decode_stream::<AgentMessage, AgentWire>(&bytes, piece)?;
        decode_stream::<RegionMessage, AgentWire>(&bytes, piece)?;
        decode_stream::<RegionMessage, PeerWire>(&bytes, piece)?;
        if bytes.len() > 4 {
            let _ = PeerFrames::decode_payload::<PeerRequest>(&bytes[4..]);
        }
    }
}

fn csv_seed() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just(NODE_CSV),
        Just(POD_CSV),
        Just(GENAI_CSV),
        Just(AZURE_CSV)
    ]
}

fn all_traces(text: &str, params: &ServingParams) {
    let mut models = GpuModels::default();
    let _ = parse_node_csv(text, &mut models);
    let _ = parse_pod_csv(text, &models);
    if let Ok(t) = ServingTrace::parse("fuzz", text, params) {
        assert!(t
            .requests
            .windows(2)
            .all(|w| w[0].arrival_us <= w[1].arrival_us));
        let _ = t.span_us();
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn trace_readers_take_arbitrary_and_mutated_csv(
        text in prop_oneof![arbitrary_text(), csv_seed().prop_flat_map(mutated_text)]
    ) {
        let params = ServingParams::from_toml("topology.toml", EXAMPLE_TOPOLOGY).unwrap();
        all_traces(&text, &params);
    }
}

const RESPONSES: &[&[u8]] = &[
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n",
    b"HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\n\r\nread to close",
    b"HTTP/1.1 204 No Content\r\n\r\n",
];

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_agent_http_client_takes_arbitrary_and_mutated_responses(
        bytes in prop_oneof![
            arbitrary_bytes(),
            proptest::sample::select(RESPONSES).prop_flat_map(|r| mutated_bytes(r.to_vec())),
        ],
        max_body in prop_oneof![Just(0usize), Just(16usize), Just(1usize << 20)],
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let got = rt.block_on(async {
            // The "server" sends the bytes, closes its side and drains the
            // request: the client's parser sees exactly this input.
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (client, mut server) = tokio::io::duplex(64 * 1024);
            let input = bytes.clone();
            tokio::spawn(async move {
                let _ = server.write_all(&input).await;
                let _ = server.shutdown().await;
                let mut sink = [0u8; 1024];
                while server.read(&mut sink).await.unwrap_or(0) > 0 {}
            });
            tokio::time::timeout(Duration::from_secs(10), read_response(client, "POST", max_body)).await
        });
        // A finite input is answered at once: a value or an error.
        let got = got.map_err(|_| TestCaseError::fail("the parser waited on a finite input"))?;
        if let Ok(resp) = got {
            prop_assert!(resp.body.len() <= max_body);
        }
    }
}

// ---- The region's JSON bodies, through a real replica. -------------------

/// One route and a valid body for it.
struct Route {
    method: &'static str,
    path: &'static str,
    tenant_token: bool,
    seed: Value,
}

fn routes() -> Vec<Route> {
    let quota = json!({"compute_milli": 4000, "memory_mib": 32768, "instances": 8});
    vec![
        Route {
            method: "POST",
            path: "/v1/functions",
            tenant_token: true,
            seed: json!({
                "name": "f1", "runtime": "pytorch", "memory_mib": 1024, "compute_milli": 250,
                "tier": "oversubscribed", "deadline_ms": 200, "pool": "any",
                "min_instances": 1, "max_instances": 2, "idle_timeout_s": 60,
                "latency": {"full_gpu_us": 40000, "saturation_milli": 1000}
            }),
        },
        Route {
            method: "POST",
            path: "/v1/tenants",
            tenant_token: false,
            seed: json!({"name": "t1", "display_name": "T", "quotas": {"center": quota, "edge": quota}}),
        },
        Route {
            method: "PUT",
            path: "/v1/tenants/acme",
            tenant_token: false,
            seed: json!({"display_name": "Acme", "quotas": {"center": quota}}),
        },
        Route {
            method: "PUT",
            path: "/v1/tenants/acme/quotas/center",
            tenant_token: false,
            seed: quota.clone(),
        },
        Route {
            method: "POST",
            path: "/v1/tenants/acme/tokens",
            tenant_token: false,
            seed: json!({"token_id": "fuzz"}),
        },
        Route {
            method: "POST",
            path: "/v1/agents",
            tenant_token: false,
            seed: json!({"agent": "a1", "node": "local-c1", "version": "0.1.0"}),
        },
        Route {
            method: "POST",
            path: "/v1/usage",
            tenant_token: false,
            seed: json!({"agent": "a1", "records": [{
                "seq": 1, "tenant": "acme", "function": "f1", "tier": "oversubscribed",
                "gpu_model": "sim-gpu-16g", "pool_kind": "center",
                "compute_milli_gpu_ms": 100, "memory_mib_ms": 200, "invocations": 1, "end_ms": 1000
            }]}),
        },
    ]
}

/// The price list of the local topology, as a `PUT /v1/prices` body's `toml`.
fn pricing_toml() -> String {
    let start = LOCAL_TOPOLOGY
        .find("[pricing]")
        .expect("a [pricing] section");
    LOCAL_TOPOLOGY[start..].to_string()
}

/// Sends `body` and checks the answer: a 2xx, or a 4xx with a JSON error
/// code; never a 5xx, never no answer.
fn send(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: &[u8],
) -> Result<u16, TestCaseError> {
    let text = String::from_utf8_lossy(body);
    let reply = gshare_region::http_client::request(
        addr,
        method,
        path,
        Some(token),
        Some(&text),
        Duration::from_secs(20),
    )
    .map_err(|e| TestCaseError::fail(format!("no answer to {method} {path} {text}: {e}")))?;
    prop_assert!(
        reply.status < 500,
        "{method} {path} {text} -> {} {}",
        reply.status,
        reply.body
    );
    if reply.status >= 400 {
        let v: Value = serde_json::from_str(&reply.body)
            .map_err(|_| TestCaseError::fail(format!("non-JSON error {}", reply.body)))?;
        prop_assert!(v["error"]["code"].is_string(), "{}", reply.body);
    }
    Ok(reply.status)
}

#[test]
fn api_json_bodies_take_mutations_through_a_real_replica() {
    let mut region = gshare_tests::TestRegion::new(1).unwrap();
    region.start(1, true).unwrap();
    region.wait_leader(&[1], Duration::from_secs(30)).unwrap();
    let addr = region.http(1);
    let op = gshare_tests::TOKEN;
    // --init proposes the topology and tenants files once a leader exists.
    let loaded = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = gshare_region::http_client::request(
            addr,
            "GET",
            "/v1/tenants",
            Some(op),
            None,
            Duration::from_secs(10),
        );
        let tenants = r
            .ok()
            .and_then(|r| serde_json::from_str::<Value>(&r.body).ok())
            .and_then(|v| v.as_array().map(Vec::len));
        if tenants == Some(2) {
            break;
        }
        assert!(
            std::time::Instant::now() < loaded,
            "--init did not load the tenants"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let issued = gshare_region::http_client::request(
        addr,
        "POST",
        "/v1/tenants/acme/tokens",
        Some(op),
        Some("{}"),
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(issued.status < 300, "{}", issued.body);
    let tenant: String = serde_json::from_str::<Value>(&issued.body).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();

    for route in routes() {
        let token = if route.tenant_token { &tenant } else { op };
        let mut runner = TestRunner::new(config());
        let strategy = prop_oneof![
            4 => mutated_json(route.seed.clone()),
            1 => arbitrary_bytes(),
        ];
        let result = runner.run(&strategy, |body| {
            send(addr, route.method, route.path, token, &body).map(|_| ())
        });
        if let Err(e) = result {
            panic!("{} {}: {e}", route.method, route.path);
        }
    }
    // Price lists and topologies arrive as TOML inside JSON.
    let mut runner = TestRunner::new(config());
    let strategy = (
        prop_oneof![Just("/v1/prices"), Just("/v1/topology/reload")],
        prop_oneof![
            mutated_text(&pricing_toml()).boxed(),
            mutated_text(LOCAL_TOPOLOGY).boxed()
        ],
    );
    let result = runner.run(&strategy, |(path, toml)| {
        let method = if path == "/v1/prices" { "PUT" } else { "POST" };
        let body = serde_json::to_vec(&json!({ "toml": toml })).unwrap();
        send(addr, method, path, op, &body).map(|_| ())
    });
    if let Err(e) = result {
        panic!("TOML bodies: {e}");
    }
    // Still serving, and the state dump still reads.
    let state = gshare_region::http_client::request(
        addr,
        "GET",
        "/v1/cluster/state",
        Some(op),
        None,
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(state.status, 200, "{}", state.body);
}
