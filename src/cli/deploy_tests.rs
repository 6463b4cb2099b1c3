//! `deploy/`: the systemd unit and the Kubernetes DaemonSet run `eim watch`
//! with arguments this binary's own parser accepts, with the privileges,
//! mounts and sockets those arguments need. (`deploy/check` runs
//! `systemd-analyze verify` on the unit; this reads both files as eim's
//! code would be run by them.)

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser as _;
use serde_json::Value;

use crate::backend::BackendKind;
use crate::watch::WatchArgs;
use crate::{Cli, Command};

fn deploy_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `argv` as `eim` parses it: a `watch`, or the test fails naming the
/// parser's complaint.
fn watch_args(argv: &[String]) -> WatchArgs {
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Command::Watch(args),
            ..
        }) => args,
        Ok(other) => panic!("{argv:?} is not `eim watch`: {other:?}"),
        Err(e) => panic!("{argv:?} is not a valid eim command line:\n{e}"),
    }
}

/// The values of `key=` in a unit file, every line of it (systemd
/// accumulates list settings over repeated lines).
fn unit_values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("{key}=");
    unit.lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .flat_map(str::split_whitespace)
        .collect()
}

/// The capability names eim's kernel backend says it needs
/// (`eim_bpf::probe::NEEDED`), the list `eim` names when one is missing.
fn needed_capabilities() -> Vec<&'static str> {
    eim::bpf::probe::NEEDED.iter().map(|(_, n, _)| *n).collect()
}

#[test]
fn the_systemd_unit_runs_a_kernel_watch_with_what_it_needs() {
    let unit = deploy_file("eim.service");
    let exec: Vec<String> = unit_values(&unit, "ExecStart")
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(exec.first().map(String::as_str), Some("/usr/local/bin/eim"));
    // Split on white space above: a quoted argument would need systemd's
    // quoting rules, which this test does not implement.
    assert!(exec.iter().all(|a| !a.contains(['"', '\''])), "{exec:?}");
    let args = watch_args(&exec);
    assert_eq!(args.backend.backend, BackendKind::Kernel);
    assert!(!args.backend.no_pin, "the profiler opens pinned maps");

    // The pins and the lock are writable; nothing else is.
    assert_eq!(unit_values(&unit, "ProtectSystem"), ["strict"]);
    let writable: Vec<PathBuf> = unit_values(&unit, "ReadWritePaths")
        .into_iter()
        .map(PathBuf::from)
        .collect();
    assert!(
        writable
            .iter()
            .any(|w| args.backend.pin_dir().starts_with(w)),
        "the pin directory {} is not under ReadWritePaths {writable:?}",
        args.backend.pin_dir().display()
    );
    let lock_dir = Path::new(eim::bpf::lock::LOCK_DIR);
    let runtime: Vec<PathBuf> = unit_values(&unit, "RuntimeDirectory")
        .into_iter()
        .map(|d| Path::new("/run").join(d))
        .collect();
    assert!(
        runtime.iter().any(|d| d == lock_dir) || writable.iter().any(|w| lock_dir.starts_with(w)),
        "the lock directory {} is not writable",
        lock_dir.display()
    );

    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        let caps = unit_values(&unit, key);
        for cap in needed_capabilities() {
            assert!(caps.contains(&cap), "{key} lacks {cap}: {caps:?}");
        }
    }
    let syscalls = unit_values(&unit, "SystemCallFilter");
    assert!(
        syscalls.contains(&"bpf"),
        "bpf(2) filtered out: {syscalls:?}"
    );
    // The host events attach to tracepoints through perf_event_open(2).
    assert!(
        syscalls.contains(&"perf_event_open"),
        "perf_event_open(2) filtered out: host events would fall back to polling: {syscalls:?}"
    );
    assert!(
        unit_values(&unit, "After").contains(&"sys-kernel-tracing.mount"),
        "tracefs is not ordered before eim"
    );
    if let Some(addr) = args.metrics_addr {
        let family = if addr.is_ipv4() {
            "AF_INET"
        } else {
            "AF_INET6"
        };
        let families = unit_values(&unit, "RestrictAddressFamilies");
        assert!(
            families.contains(&family),
            "--metrics-addr {addr} needs {family}: {families:?}"
        );
    }
    // systemd makes /sys/fs/bpf read-only under it, whatever ReadWritePaths says.
    assert!(unit_values(&unit, "ProtectKernelTunables").is_empty());
}

/// `v` at `pointer`, or the test fails naming the field.
fn at<'a>(v: &'a Value, pointer: &str) -> &'a Value {
    v.pointer(pointer)
        .unwrap_or_else(|| panic!("the DaemonSet has no {pointer}"))
}

fn strings(v: &Value, pointer: &str) -> Vec<String> {
    at(v, pointer)
        .as_array()
        .unwrap_or_else(|| panic!("{pointer} is not a list"))
        .iter()
        .map(|s| match s {
            Value::String(s) => s.clone(),
            other => panic!("{pointer}: {other} is not a string"),
        })
        .collect()
}

/// The host path mounted at `mount_path` in the container, with the
/// mount's propagation (`None`: Kubernetes' default, none).
fn host_mount(pod: &Value, container: &Value, mount_path: &str) -> (String, Option<String>) {
    let mounts = at(container, "/volumeMounts")
        .as_array()
        .expect("volumeMounts is a list");
    let mount = mounts
        .iter()
        .find(|m| m["mountPath"] == mount_path)
        .unwrap_or_else(|| panic!("nothing is mounted at {mount_path}"));
    let volume = at(pod, "/volumes")
        .as_array()
        .expect("volumes is a list")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {} for {mount_path}", mount["name"]));
    let host = at(volume, "/hostPath/path")
        .as_str()
        .expect("a host path")
        .to_owned();
    let propagation = mount["mountPropagation"].as_str().map(str::to_owned);
    (host, propagation)
}

#[test]
fn the_daemonset_runs_a_kernel_watch_with_the_nodes_processes_and_pins() {
    let text = deploy_file("eim-daemonset.yaml");
    let ds: Value = serde_yaml_ng::from_str(&text).expect("the DaemonSet is YAML");
    assert_eq!(ds["apiVersion"], "apps/v1");
    assert_eq!(ds["kind"], "DaemonSet");
    // The API server refuses a selector that the pods' labels do not match.
    let labels = at(&ds, "/spec/template/metadata/labels");
    for (k, v) in at(&ds, "/spec/selector/matchLabels")
        .as_object()
        .expect("matchLabels is a map")
    {
        assert_eq!(&labels[k], v, "the selector's {k} is not on the pods");
    }

    let pod = at(&ds, "/spec/template/spec");
    assert_eq!(pod["hostPID"], true, "eim must see the node's processes");
    let containers = at(pod, "/containers").as_array().expect("a list");
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    let mut argv = strings(container, "/command");
    argv.extend(strings(container, "/args"));
    assert_eq!(argv.first().map(String::as_str), Some("/usr/local/bin/eim"));
    let args = watch_args(&argv);
    assert_eq!(args.backend.backend, BackendKind::Kernel);
    assert!(!args.backend.no_pin, "the profiler opens pinned maps");

    // The pins on the node's bpffs, shared both ways.
    let (bpffs, propagation) = host_mount(pod, container, "/sys/fs/bpf");
    assert_eq!(bpffs, "/sys/fs/bpf");
    assert!(args.backend.pin_dir().starts_with("/sys/fs/bpf"));
    assert_eq!(propagation.as_deref(), Some("Bidirectional"));
    let security = at(container, "/securityContext");
    // The API server allows Bidirectional propagation only when privileged.
    assert_eq!(security["privileged"], true);
    // ...and refuses allowPrivilegeEscalation: false beside privileged.
    assert_ne!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    // The lock on the node, shared with every other eim there.
    let (lock, _) = host_mount(pod, container, eim::bpf::lock::LOCK_DIR);
    assert_eq!(lock, eim::bpf::lock::LOCK_DIR);
    // The container's /proc is the host's PID namespace's (hostPID).
    let mounts = at(container, "/volumeMounts").as_array().expect("a list");
    assert!(mounts.iter().all(|m| m["mountPath"] != "/proc"));

    // Metrics on the pod's address, at the declared port; the probe asks
    // the health endpoint the metrics server answers.
    let addr: SocketAddr = args.metrics_addr.expect("--metrics-addr");
    assert!(
        addr.ip().is_unspecified(),
        "{addr}: the kubelet probes the pod's IP"
    );
    let ports = at(container, "/ports").as_array().expect("a list");
    let port = ports
        .iter()
        .find(|p| p["containerPort"] == addr.port())
        .unwrap_or_else(|| panic!("port {} is not declared", addr.port()));
    let probe = at(container, "/livenessProbe/httpGet");
    assert_eq!(probe["path"], "/healthz");
    assert!(
        probe["port"] == port["name"] || probe["port"] == addr.port(),
        "the probe asks port {}, eim serves {}",
        probe["port"],
        addr.port()
    );
    assert!(
        at(container, "/resources/limits/memory").is_string(),
        "a memory limit"
    );
}
