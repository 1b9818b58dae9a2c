use super::*;
use crate::model::{
    FunctionSpec, GpuId, LatencyProfile, NodeId, PoolKind, PoolPreference, Runtime, Slice,
    TenantId, Tier,
};
use crate::state::{AgentId, InstanceId, UsageRecord};

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
            full_gpu_us: 10_000,
            saturation_milli: 500,
        },
    }
}

fn every_message() -> (Vec<AgentMessage>, Vec<RegionMessage>) {
    let agent = AgentId("n1".into());
    let agents = vec![
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
        AgentMessage::v1(AgentMessageV1::RegisterGpus {
            register: Register {
                agent: agent.clone(),
                node: NodeId("n1".into()),
                pool: "center".into(),
                version: "0.1.0".into(),
                gpus: Vec::new(),
                ingress: "127.0.0.1:9000".into(),
            },
            allow_fewer_gpus: true,
        }),
        AgentMessage::v1(AgentMessageV1::RegisterWith {
            register: Register {
                agent: agent.clone(),
                node: NodeId("n1".into()),
                pool: "center".into(),
                version: "0.1.0".into(),
                gpus: Vec::new(),
                ingress: "127.0.0.1:9000".into(),
            },
            allow_fewer_gpus: false,
            features: vec![super::FEATURE_CUT_OFF.into()],
        }),
        AgentMessage::v1(AgentMessageV1::Leaving {
            agent: agent.clone(),
        }),
        AgentMessage::v1(AgentMessageV1::Heartbeat(Heartbeat {
            agent: agent.clone(),
            at_ms: 5,
            gpus: vec![GpuStatus {
                index: 0,
                utilization_milli: 1500,
                memory_used_mib: 4096,
                resident: vec![InstanceId(3)],
                queued: 7,
                measured_utilization_pct: Some(87),
                measured_memory_used_mib: Some(30_000),
            }],
            in_flight: 9,
            swaps: 2,
            counters: AgentCounters {
                process_crashes: 1,
                usage_pending_records: 12,
                ..AgentCounters::default()
            },
            instances: vec![InstanceStatus {
                instance: InstanceId(3),
                state: InstanceState::Resident,
                gpus: vec![0],
            }],
        })),
        AgentMessage::v1(AgentMessageV1::Swaps {
            agent: agent.clone(),
            events: vec![SwapEvent {
                instance: InstanceId(3),
                kind: SwapKind::Move,
                from_gpu: Some(0),
                to_gpu: Some(1),
                at_ms: 10,
                duration_us: 1_500_000,
            }],
        }),
        AgentMessage::v1(AgentMessageV1::Loads {
            agent: agent.clone(),
            at_ms: 7,
            loads: vec![FunctionLoad {
                tenant: TenantId("acme".into()),
                function: "resnet".into(),
                arrivals: 12,
                in_flight: 2,
                waiting: 3,
                queue_wait_us: 4_000,
                deadline_misses: 1,
                early_rejects: 5,
                swaps: 6,
                idle_ms: u64::MAX,
            }],
            dropped: 9,
        }),
        AgentMessage::v1(AgentMessageV1::HostCopies {
            agent: agent.clone(),
            copies: vec![HostCopy {
                tenant: TenantId("acme".into()),
                function: "resnet".into(),
                version: 3,
                memory_mib: 4_096,
            }],
        }),
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
            id: 4,
            outcome: InvokeOutcome::Failed(InvokeError::DeadlineUnreachable {
                predicted_us: 10,
                deadline_us: 5,
            }),
        })),
        AgentMessage::v1(AgentMessageV1::InvokeReply(InvokeReply {
            id: 5,
            outcome: InvokeOutcome::Done {
                body: b"ok".to_vec(),
                queued_us: 1,
                service_us: 2,
            },
        })),
    ];
    let regions = vec![
        RegionMessage::v1(RegionMessageV1::Registered {
            next_seq: 11,
            leader: 2,
        }),
        RegionMessage::v1(RegionMessageV1::Refused {
            code: "unknown_node".into(),
            message: "no such node".into(),
            retry: false,
        }),
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
        RegionMessage::v1(RegionMessageV1::UsageAck { seqs: vec![1, 2] }),
        RegionMessage::v1(RegionMessageV1::Invoke(InvokeRequest {
            id: 4,
            tenant: TenantId("acme".into()),
            function: "resnet".into(),
            deadline_ms: Some(50),
            body: vec![1, 2, 3],
        })),
        RegionMessage::v1(RegionMessageV1::Ack),
        RegionMessage::v1(RegionMessageV1::InvokeStreamed {
            key: "k1".into(),
            request: InvokeRequest {
                id: 5,
                tenant: TenantId("acme".into()),
                function: "resnet".into(),
                deadline_ms: None,
                body: Vec::new(),
            },
            call: None,
            len: Some(10),
        }),
        RegionMessage::v1(RegionMessageV1::InvokeBodyChunk {
            id: 5,
            data: vec![9; 10],
        }),
        RegionMessage::v1(RegionMessageV1::InvokeBodyEnd { id: 5 }),
        RegionMessage::v1(RegionMessageV1::Granted { applied_index: 42 }),
    ];
    (agents, regions)
}

/// The streamed body's frames were appended: every older region message
/// keeps its variant number (an agent of this version decodes an older
/// replica's frames, and the reverse for the frames both know).
#[test]
fn the_streamed_body_frames_come_after_every_older_region_message() {
    let payload = |m: RegionMessageV1| encode_frame(&RegionMessage::v1(m)).unwrap()[4..].to_vec();
    // `V1`, then the variant's number.
    assert_eq!(payload(RegionMessageV1::Ack), vec![0, 6]);
    assert_eq!(
        payload(RegionMessageV1::InvokeBodyEnd { id: 3 }),
        vec![0, 12, 3]
    );
    let chunk = payload(RegionMessageV1::InvokeBodyChunk {
        id: 3,
        data: vec![1],
    });
    assert_eq!(chunk[..2], [0, 11]);
    // And `Granted` after them.
    assert_eq!(
        payload(RegionMessageV1::Granted { applied_index: 3 }),
        vec![0, 13, 3]
    );
}

#[test]
fn every_message_round_trips_through_a_frame() {
    let (agents, regions) = every_message();
    for m in agents {
        let f = encode_frame(&m).unwrap();
        assert_eq!(frame_len_of(&f), f.len() - 4);
        assert_eq!(decode_payload::<AgentMessage>(&f[4..]).unwrap(), m);
    }
    for m in regions {
        let f = encode_frame(&m).unwrap();
        assert_eq!(decode_payload::<RegionMessage>(&f[4..]).unwrap(), m);
    }
}

fn frame_len_of(f: &[u8]) -> usize {
    u32::from_be_bytes(f[..4].try_into().unwrap()) as usize
}

#[test]
fn decoder_reassembles_frames_split_anywhere() {
    let (_, regions) = every_message();
    let mut bytes = Vec::new();
    for m in &regions {
        bytes.extend(encode_frame(m).unwrap());
    }
    for chunk in [1usize, 3, 7, 64, bytes.len()] {
        let mut dec = FrameDecoder::new();
        let mut got = Vec::new();
        for piece in bytes.chunks(chunk) {
            dec.push(piece).unwrap();
            while let Some(m) = dec.next_message::<RegionMessage>().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, regions, "chunk size {chunk}");
        assert_eq!(dec.buffered(), 0);
    }
}

#[test]
fn oversized_length_is_refused_before_the_payload() {
    let mut dec = FrameDecoder::new();
    let len = (AGENT_FRAME_BYTES as u32 + 1).to_be_bytes();
    assert_eq!(
        dec.push(&len),
        Err(FrameError::Oversized {
            len: AGENT_FRAME_BYTES + 1,
            limit: AGENT_FRAME_BYTES
        })
    );
    assert_eq!(dec.buffered(), 0);
    // The decoder stays failed: the connection must close.
    assert!(dec.push(&[0]).is_err());
    assert!(dec.next_message::<AgentMessage>().is_err());
}

#[test]
fn garbage_and_trailing_bytes_are_malformed() {
    let mut dec = FrameDecoder::new();
    dec.push(&[0, 0, 0, 3, 0xff, 0xff, 0xff]).unwrap();
    assert!(matches!(
        dec.next_message::<AgentMessage>(),
        Err(FrameError::Malformed { .. })
    ));
    let m = RegionMessage::v1(RegionMessageV1::Ack);
    let mut f = encode_frame(&m).unwrap()[4..].to_vec();
    f.push(0);
    assert!(matches!(
        decode_payload::<RegionMessage>(&f),
        Err(FrameError::Malformed { .. })
    ));
    // An unknown envelope version is malformed, not misread.
    assert!(matches!(
        decode_payload::<RegionMessage>(&[1, 0]),
        Err(FrameError::Malformed { .. })
    ));
}

#[test]
fn encoding_refuses_a_message_over_the_cap() {
    let big = RegionMessage::v1(RegionMessageV1::Invoke(InvokeRequest {
        id: 1,
        tenant: TenantId("t".into()),
        function: "f".into(),
        deadline_ms: None,
        body: vec![0; AGENT_FRAME_BYTES + 1],
    }));
    assert!(encode_frame(&big).is_err());
}

#[test]
fn token_digest_is_lower_case_sha256_hex() {
    assert_eq!(
        token_digest("abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        token_digest(""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

#[test]
fn a_frame_at_the_agent_limit_round_trips_and_one_byte_more_is_refused() {
    // The largest invoke body whose frame is exactly AGENT_FRAME_BYTES.
    let with_body = |n: usize| {
        RegionMessage::v1(RegionMessageV1::Invoke(InvokeRequest {
            id: 1,
            tenant: TenantId("t".into()),
            function: "f".into(),
            deadline_ms: None,
            body: vec![7; n],
        }))
    };
    let overhead = encode_frame(&with_body(AGENT_FRAME_BYTES - 64))
        .unwrap()
        .len()
        - 4
        - (AGENT_FRAME_BYTES - 64);
    let at_limit = with_body(AGENT_FRAME_BYTES - overhead);
    let f = encode_frame(&at_limit).unwrap();
    assert_eq!(f.len() - 4, AGENT_FRAME_BYTES);
    let mut dec = FrameDecoder::new();
    dec.push(&f).unwrap();
    assert_eq!(dec.next_message::<RegionMessage>().unwrap(), Some(at_limit));
    assert_eq!(
        encode_frame(&with_body(AGENT_FRAME_BYTES - overhead + 1)),
        Err(FrameError::Oversized {
            len: AGENT_FRAME_BYTES + 1,
            limit: AGENT_FRAME_BYTES
        })
    );
    // The peer wire is explicitly bigger, and its frames are refused by agents.
    let big = PeerFrames::encode(&with_body(AGENT_FRAME_BYTES)).unwrap();
    assert!(matches!(
        AgentFrames::frame_len(&big),
        Err(FrameError::Oversized { .. })
    ));
    assert!(PeerFrames::decode_payload::<RegionMessage>(&big[4..]).is_ok());
}

#[test]
fn a_length_inside_the_payload_over_the_limit_is_malformed_not_allocated() {
    // Envelope V1 (0), Invoke variant, then a body `Vec<u8>` claiming 2^40 bytes.
    let m = RegionMessage::v1(RegionMessageV1::Invoke(InvokeRequest {
        id: 1,
        tenant: TenantId("t".into()),
        function: "f".into(),
        deadline_ms: None,
        body: vec![1, 2, 3],
    }));
    let f = encode_frame(&m).unwrap();
    let payload = &f[4..];
    // The body's length (3) is the byte before its three bytes at the end.
    let at = payload.len() - 4;
    assert_eq!(payload[at], 3);
    let mut forged = payload[..at].to_vec();
    forged.push(253); // bincode varint: a u64 follows
    forged.extend_from_slice(&(1u64 << 40).to_le_bytes());
    forged.extend_from_slice(&[1, 2, 3]);
    assert!(matches!(
        decode_payload::<RegionMessage>(&forged),
        Err(FrameError::Malformed { .. })
    ));
}

#[test]
fn a_full_load_report_of_longest_names_fits_well_under_the_frame_limit() {
    let name = "x".repeat(crate::config::MAX_NAME_LEN);
    let load = FunctionLoad {
        tenant: TenantId(name.clone()),
        function: name,
        arrivals: u64::MAX,
        in_flight: u32::MAX,
        waiting: u32::MAX,
        queue_wait_us: u64::MAX,
        deadline_misses: u64::MAX,
        early_rejects: u64::MAX,
        swaps: u64::MAX,
        idle_ms: u64::MAX,
    };
    let m = AgentMessage::v1(AgentMessageV1::Loads {
        agent: AgentId("n1".into()),
        at_ms: u64::MAX,
        loads: vec![load; MAX_FUNCTION_LOADS],
        dropped: u64::MAX,
    });
    let f = encode_frame(&m).unwrap();
    println!(
        "a full load report: {} entries of longest names, {} bytes",
        MAX_FUNCTION_LOADS,
        f.len()
    );
    // The documented bound: under 200 bytes an entry, 200 KiB a report.
    assert!(f.len() < MAX_FUNCTION_LOADS * 200, "{} bytes", f.len());
    assert!(f.len() < AGENT_FRAME_BYTES);
    assert_eq!(decode_payload::<AgentMessage>(&f[4..]).unwrap(), m);
}

#[test]
fn a_full_host_copy_report_of_longest_names_fits_its_documented_bound() {
    let name = "x".repeat(crate::config::MAX_NAME_LEN);
    let copy = HostCopy {
        tenant: TenantId(name.clone()),
        function: name,
        version: u64::MAX,
        memory_mib: u64::MAX,
    };
    let m = AgentMessage::v1(AgentMessageV1::HostCopies {
        agent: AgentId("n1".into()),
        copies: vec![copy; MAX_HOST_COPIES],
    });
    let f = encode_frame(&m).unwrap();
    println!(
        "a full host copy report: {} entries of longest names, {} bytes",
        MAX_HOST_COPIES,
        f.len()
    );
    assert!(f.len() < MAX_HOST_COPIES * 150, "{} bytes", f.len());
    assert!(f.len() < AGENT_FRAME_BYTES);
    assert_eq!(decode_payload::<AgentMessage>(&f[4..]).unwrap(), m);
}
