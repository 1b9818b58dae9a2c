//! The microVM pieces that need no VM: acceleration rule, the guest's
//! run script, the per-function archive, the QEMU command line.

use super::*;
use crate::runtime::process::SliceLimits;

fn template(extra: &str) -> RuntimeTemplate {
    let text = format!(
        "runtime = \"custom\"\ncommand = [\"python3\", \"echo_server.py\", \"--host\", \"{{host}}\", \"--port\", \"{{port}}\"]\n\
         [env]\nGREETING = \"it's {{instance}}\"\n[vm]\nfiles = [\"echo_server.py\", \"lib/util.py\"]\nguest_port = 9090\n{extra}"
    );
    RuntimeTemplate::parse(&text, "echo.toml").unwrap()
}

fn limits() -> SliceLimits {
    SliceLimits {
        gpus: vec![1],
        compute_milli: 250,
        memory_mib: 1024,
        gpu_memory_mib: None,
    }
}

#[test]
fn kvm_only_when_the_device_opens_and_is_not_pvm() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, sys) = (dir.path().join("kvm"), dir.path().join("module"));
    std::fs::create_dir_all(&sys).unwrap();
    let (a, why) = Accel::detect_at(&dev, &sys);
    assert_eq!(a, Accel::Tcg);
    assert!(why.contains("absent"), "{why}");
    std::fs::write(&dev, "").unwrap();
    assert_eq!(Accel::detect_at(&dev, &sys).0, Accel::Kvm);
    std::fs::create_dir_all(sys.join("kvm_pvm")).unwrap();
    let (a, why) = Accel::detect_at(&dev, &sys);
    assert_eq!(a, Accel::Tcg);
    assert!(why.contains("PVM"), "{why}");
}

#[test]
fn the_run_script_quotes_everything_and_refuses_bad_names() {
    let env = BTreeMap::from([("A_1".to_string(), "it's $HOME".to_string())]);
    let argv = vec!["python3".to_string(), "a b".to_string()];
    assert_eq!(
        run_script(&argv, &env).unwrap(),
        "# written by the gshare microvm driver\nexport A_1='it'\\''s $HOME'\nexec 'python3' 'a b'\n"
    );
    let bad = BTreeMap::from([("A-B".to_string(), "x".to_string())]);
    let e = run_script(&argv, &bad).unwrap_err().to_string();
    assert!(e.contains("env.A-B"), "{e}");
}

#[test]
fn the_vm_table_is_checked() {
    let base = "runtime = \"custom\"\ncommand = [\"x\"]\n[vm]\n";
    for (extra, key) in [
        ("files = [\"../secret\"]", "vm.files[0]"),
        ("files = [\"/etc/passwd\"]", "vm.files[0]"),
        ("memory_mib = 8", "vm.memory_mib"),
        ("guest_port = 0", "vm.guest_port"),
        ("default_boot_ms = 0", "vm.default_boot_ms"),
    ] {
        let e = RuntimeTemplate::parse(&format!("{base}{extra}\n"), "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&format!("t.toml: {key}: ")), "{extra}: {e}");
    }
    let e = RuntimeTemplate::parse(&format!("{base}disk = 1\n"), "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `disk`"), "{e}");
}

#[test]
fn the_guest_spec_forwards_a_host_port_and_appends_the_function_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("echo_server.py"), "print('hi')\n").unwrap();
    std::fs::create_dir_all(dir.path().join("lib")).unwrap();
    std::fs::write(dir.path().join("lib/util.py"), "X = 1\n").unwrap();
    let image_dir = dir.path().join("image");
    std::fs::create_dir_all(&image_dir).unwrap();
    assert!(matches!(
        MicrovmImage::open(&image_dir),
        Err(MicrovmError::Image { .. })
    ));
    std::fs::write(image_dir.join("vmlinuz"), "k").unwrap();
    std::fs::write(image_dir.join("initramfs.cpio"), "BASE").unwrap();
    let vm = MicrovmOptions {
        image: MicrovmImage::open(&image_dir).unwrap(),
        accel: Accel::Tcg,
        qemu: QEMU.into(),
        run_dir: dir.path().join("run"),
        tsc_khz: Some(2_600_000),
    };
    let t = template("memory_mib = 192\n");
    let (spec, initrd) = guest_spec(
        &t,
        Some(dir.path()),
        &vm,
        "acme-echo",
        FunctionArgs::model("echo"),
        limits(),
    )
    .unwrap();
    assert_eq!(
        (spec.host.as_str(), spec.health_path.as_str()),
        ("127.0.0.1", "/health")
    );
    assert!(spec.env.is_empty(), "{:?}", spec.env);
    let argv = spec.argv.join(" ");
    for needle in [
        "qemu-system-x86_64 -M microvm -accel tcg -cpu max",
        "-m 192 ",
        "console=ttyS0 panic=-1 reboot=t quiet tsc_early_khz=2600000",
        "-no-reboot",
        &format!(
            "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{}-:9090",
            spec.port
        ),
        &format!("-initrd {}", initrd.display()),
    ] {
        assert!(argv.contains(needle), "{needle:?} not in {argv}");
    }
    let bytes = std::fs::read(&initrd).unwrap();
    assert!(
        bytes.starts_with(b"BASE070701"),
        "the base image comes first"
    );
    let text = String::from_utf8_lossy(&bytes);
    for needle in [
        "fn/echo_server.py",
        "print('hi')",
        "fn/lib/util.py",
        "export GREETING='it'\\''s acme-echo'",
        "export CUDA_VISIBLE_DEVICES='1'",
        "exec 'python3' 'echo_server.py' '--host' '0.0.0.0' '--port' '9090'",
    ] {
        assert!(text.contains(needle), "{needle:?} not in the archive");
    }
    // A function file that is missing is an error naming it.
    std::fs::remove_file(dir.path().join("lib/util.py")).unwrap();
    let e = guest_spec(
        &t,
        Some(dir.path()),
        &vm,
        "acme-echo",
        FunctionArgs::model("echo"),
        limits(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("vm.files: ") && e.contains("util.py"), "{e}");
}
