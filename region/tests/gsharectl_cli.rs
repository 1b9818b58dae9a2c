//! `gsharectl sim placement` end to end on the embedded default: the CSV has
//! exactly the paper's columns, every cell filled, one row per policy × seed.

use std::process::Command;

use gshare_region::cli::sim_placement::parse_seeds;

#[test]
fn seeds_parse_as_one_range_or_list() {
    assert_eq!(parse_seeds("42").unwrap(), vec![42]);
    assert_eq!(parse_seeds("42-45").unwrap(), vec![42, 43, 44, 45]);
    assert_eq!(parse_seeds("1,5-6").unwrap(), vec![1, 5, 6]);
    assert!(parse_seeds("9-3").is_err());
    assert!(parse_seeds("x").is_err());
}

#[test]
fn sim_placement_writes_the_papers_columns() {
    let dir = std::env::temp_dir().join(format!("gsharectl-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("out.csv");
    let svg = dir.join("out.svg");
    let json = dir.join("out.json");
    let out = Command::new(env!("CARGO_BIN_EXE_gsharectl"))
        .args([
            "sim",
            "placement",
            "--policy",
            "fgd,06-FGD,gshare",
            "--seeds",
            "7-8",
            "--tune",
            "1.3",
        ])
        .arg("--csv")
        .arg(&csv)
        .arg("--svg")
        .arg(&svg)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("experiments/s"), "{stdout}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    assert_eq!(
        &header[..5],
        &["workload", "sc_policy", "tune", "seed", "total_gpus"]
    );
    assert_eq!(header.len(), 5 + 131);
    assert_eq!(header[5], "0");
    assert_eq!(header[135], "130");
    assert_eq!(lines.len(), 1 + 3 * 2);
    let labels: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split(',').nth(1).unwrap())
        .collect();
    assert_eq!(
        labels,
        ["fgd", "fgd", "06-FGD", "06-FGD", "gshare", "gshare"]
    );
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!(cells.len(), header.len());
        assert_eq!(cells[0], "synthetic_openb_default");
        assert_eq!(cells[4], "6212");
        for c in &cells[5..] {
            let v: f64 = c.parse().unwrap();
            assert!((0.0..=100.0).contains(&v), "{c}");
        }
    }
    // fgd and 06-FGD are the same policy: same rows but for the label.
    assert_eq!(
        lines[1].split_once(",fgd,").unwrap().1,
        lines[3].split_once(",06-FGD,").unwrap().1
    );
    // Where it wrote each file, by its full path.
    for (what, path) in [("CSV", &csv), ("SVG plot", &svg), ("JSON summary", &json)] {
        let abs = std::path::absolute(path).unwrap();
        assert!(
            stdout.contains(&format!("wrote {what}")) && stdout.contains(&*abs.to_string_lossy()),
            "{what}: {stdout}"
        );
    }
    // Progress goes to stderr on runs over a second (this one may be shorter).
    let stderr = String::from_utf8_lossy(&out.stderr);
    let secs: f64 = stdout
        .lines()
        .find_map(|l| {
            l.split(" experiments in ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap();
    if secs > 1.5 {
        assert!(stderr.contains("experiments done"), "{stderr}");
    }
    check_svg(&std::fs::read_to_string(&svg).unwrap(), 3);
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j.as_array().unwrap().len(), 3);
    std::fs::remove_dir_all(&dir).ok();
}

/// The plot: axis labels, a zoom of 85–130 %, one colour and dash pattern
/// per policy, and a legend inside the picture.
fn check_svg(svg: &str, policies: usize) {
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.contains("arrived workload, % of the cluster's GPU capacity"));
    assert!(svg.contains(">allocated GPU, %</text>"));
    assert!(svg.contains("zoom: 85–130 %"));
    let attr = |tag: &str, name: &str| -> Option<String> {
        let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        Some(tag[start..].split('"').next()?.to_string())
    };
    let width: f64 = attr(svg.lines().next().unwrap(), "width")
        .unwrap()
        .parse()
        .unwrap();
    // Policy curves: full width strokes (the paper's are faded).
    let styles: std::collections::BTreeSet<(String, String)> = svg
        .lines()
        .filter(|l| l.starts_with("<polyline") && l.contains("stroke-width=\"1.8\""))
        .map(|l| {
            (
                attr(l, "stroke").unwrap(),
                attr(l, "stroke-dasharray").unwrap(),
            )
        })
        .collect();
    assert_eq!(styles.len(), policies, "{styles:?}");
    let dashes: std::collections::BTreeSet<&String> = styles.iter().map(|(_, d)| d).collect();
    assert_eq!(
        dashes.len(),
        policies,
        "lines told apart without colour too"
    );
    // Legend entries end inside the picture (about 7.2 px a character).
    let legend: Vec<&str> = svg.lines().filter(|l| l.contains("unalloc.)")).collect();
    assert_eq!(legend.len(), policies);
    for l in legend {
        let text_tag = &l[l.rfind("<text").unwrap()..];
        let x: f64 = attr(text_tag, "x").unwrap().parse().unwrap();
        let label = text_tag
            .split('>')
            .nth(1)
            .unwrap()
            .split('<')
            .next()
            .unwrap();
        assert!(
            x + label.chars().count() as f64 * 7.2 <= width,
            "legend cut off: {label} at {x} in {width}"
        );
    }
}

#[test]
fn sim_serving_prints_its_table_to_stdout_and_names_every_trace_source() {
    let json = std::env::temp_dir().join(format!("gsharectl-serving-{}.json", std::process::id()));
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gsharectl"))
            .args(["sim", "serving"])
            .args(args)
            .arg("--json")
            .arg(&json)
            .output()
            .unwrap()
    };
    let out = run(&[
        "--synthetic",
        "--functions",
        "20",
        "--invocations",
        "500",
        "--gpus",
        "2",
        "--policy",
        "gshare",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("gshare") && stdout.contains("events in"),
        "{stdout}"
    );
    // No source: the error names all three, not only --trace.
    let out = run(&["--gpus", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for flag in ["--trace", "--llm-trace", "--synthetic"] {
        assert!(stderr.contains(flag), "{flag}: {stderr}");
    }
    // --llm-trace conflicts with --trace and --synthetic.
    for other in [["--trace", "x.csv"].as_slice(), ["--synthetic"].as_slice()] {
        let mut args = vec!["--llm-trace", "y.csv", "--gpus", "2"];
        args.extend_from_slice(other);
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("cannot be used with"), "{stderr}");
    }
    let _ = std::fs::remove_file(&json);
}

#[test]
fn sim_serving_prints_its_table_without_a_json_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_gsharectl"))
        .args([
            "sim",
            "serving",
            "--synthetic",
            "--functions",
            "20",
            "--invocations",
            "2000",
            "--seed",
            "1",
            "--gpus",
            "2",
            "--policy",
            "gshare",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.lines().any(|l| l.starts_with("gshare")),
        "no gshare row on stdout: {stdout}"
    );
}
