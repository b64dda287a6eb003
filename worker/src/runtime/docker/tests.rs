use super::*;
use crate::runtime::Mount;

#[test]
fn container_contract() {
    let spec = RunSpec {
        uuid: "0xabc".into(),
        command: "cat d".into(),
        image: "img:latest".into(),
        bundle_path: "/w/runs/0xabc".into(),
        mounts: vec![Mount {
            host: "/w/dependencies/0xdef".into(),
            container: "/0xabc_dependencies/d".into(),
            read_only: true,
        }],
        user: "1000:1000".into(),
        memory_bytes: 2 << 30,
        cpuset: vec![0, 2],
        gpu_uuids: vec!["GPU-1".into()],
        shm_size_bytes: 1 << 30,
        network: false,
        worker_id: "w1".into(),
        pids_limit: 4096,
        no_capabilities: false,
    };
    let body = create_body(
        &spec,
        &run_network(&spec, "pfx", Engine::Docker),
        Engine::Docker,
    )
    .unwrap();
    assert_eq!(body.working_dir.as_deref(), Some("/0xabc"));
    assert_eq!(body.user.as_deref(), Some("1000:1000"));
    let env = body.env.unwrap();
    assert!(env.contains(&"HOME=/0xabc".to_string()));
    assert!(env.contains(&"CODALAB=true".to_string()));
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-1".to_string()));
    let hc = body.host_config.unwrap();
    assert!(hc.binds.is_none());
    let mounts: Vec<_> = hc
        .mounts
        .unwrap()
        .into_iter()
        .map(|m| {
            assert_eq!(m.typ, Some(MountType::BIND));
            (m.source.unwrap(), m.target.unwrap(), m.read_only.unwrap())
        })
        .collect();
    assert_eq!(
        mounts,
        vec![
            ("/w/runs/0xabc".into(), "/0xabc".into(), false),
            (
                "/w/dependencies/0xdef".into(),
                "/0xabc_dependencies/d".into(),
                true
            )
        ]
    );
    assert_eq!(hc.memory, Some(2 << 30));
    assert_eq!(hc.memory_swap, Some(2 << 30));
    assert_eq!(hc.pids_limit, Some(4096));
    assert_eq!(
        hc.security_opt.as_deref(),
        Some(&["no-new-privileges".to_string()][..])
    );
    assert!(hc
        .cap_drop
        .as_ref()
        .unwrap()
        .contains(&"NET_RAW".to_string()));
    assert_eq!(hc.cpuset_cpus.as_deref(), Some("0,2"));
    assert_eq!(hc.shm_size, Some(1 << 30));
    assert_eq!(hc.network_mode.as_deref(), Some("pfx_int"));
    let dr = &hc.device_requests.unwrap()[0];
    assert_eq!(dr.device_ids.as_deref(), Some(&["GPU-1".to_string()][..]));
    assert_eq!(body.labels.unwrap()[LABEL_WORKER_ID], "w1");
    assert!(hc.devices.is_none());
    // Under Podman the same GPU is a CDI device.
    let hc = create_body(
        &spec,
        &run_network(&spec, "pfx", Engine::Podman),
        Engine::Podman,
    )
    .unwrap()
    .host_config
    .unwrap();
    assert!(hc.device_requests.is_none());
    // ... and the run is on a network of its own.
    assert_eq!(hc.network_mode.as_deref(), Some("pfx_run_0xabc"));
    let d = &hc.devices.unwrap()[0];
    assert_eq!(d.path_on_host.as_deref(), Some("nvidia.com/gpu=GPU-1"));
    // A run without GPUs gets none, even from an image that asks for all.
    let spec = RunSpec {
        gpu_uuids: vec![],
        ..spec
    };
    for engine in [Engine::Docker, Engine::Podman] {
        let body = create_body(&spec, &run_network(&spec, "pfx", engine), engine).unwrap();
        let env = body.env.unwrap();
        assert!(
            env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()),
            "{env:?}"
        );
        let hc = body.host_config.unwrap();
        assert!(hc.device_requests.is_none() && hc.devices.is_none());
    }
}

#[test]
fn paths_that_cannot_be_carried_exactly_are_refused_never_approximated() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let mut spec = conformance_spec();
    for (host, target) in [
        (OsStr::from_bytes(b"/w/dep/x\xff"), "/0xabc_dependencies/x"),
        (OsStr::new("/w/dep/a,source=."), "/0xabc_dependencies/a"),
        (OsStr::new("/w/dep/a"), "/0xabc_dependencies/a,ro=false"),
        (OsStr::new("/w/dep/a:b"), "/0xabc_dependencies/a"),
        (OsStr::new("/w/dep/a\nb"), "/0xabc_dependencies/a"),
    ] {
        spec.mounts = vec![Mount {
            host: host.into(),
            container: target.into(),
            read_only: true,
        }];
        let e = create_body(&spec, "net", Engine::Podman).unwrap_err();
        assert!(e.to_string().contains("exactly"), "{e}");
    }
    // Under --run-as-user every capability is dropped.
    spec.mounts.clear();
    spec.no_capabilities = true;
    let hc = create_body(&spec, "net", Engine::Docker)
        .unwrap()
        .host_config
        .unwrap();
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
}

fn conformance_spec() -> RunSpec {
    crate::runtime::conformance::spec_in(
        std::path::Path::new("/tmp/clw-unit"),
        "w",
        "img:latest",
        crate::runtime::conformance::Behaviour::Exit(0),
    )
}

#[test]
fn docker_times() {
    assert_eq!(parse_time(Some("1970-01-01T00:00:10Z")), Some(10.0));
    assert_eq!(
        parse_time(Some("2026-11-21T10:00:00.5Z")),
        Some(1_795_255_200.5)
    );
    assert_eq!(parse_time(Some("1970-01-01T01:00:00+01:00")), Some(0.0));
    assert_eq!(parse_time(Some("0001-01-01T00:00:00Z")), None);
    assert_eq!(parse_time(None), None);
}

fn listed(id: &str, name: &str, icc: Option<&str>) -> bollard::models::Network {
    bollard::models::Network {
        id: Some(id.into()),
        name: Some(name.into()),
        options: icc.map(|v| HashMap::from([(ICC_OPTION.to_owned(), v.to_owned())])),
        ..Default::default()
    }
}

#[test]
fn networks_in_place_wants_each_name_once_and_isolated() {
    use super::network::{networks_in_place, NetworkIds};
    let all = vec![
        listed("c1", "p_int", Some("false")),
        listed("a1", "p_general", Some("false")),
        listed("b1", "p_ext", Some("false")),
        // Another prefix that holds this one: not ours.
        listed("z9", "p_ext2_ext", None),
    ];
    assert_eq!(
        networks_in_place("p", &all),
        Some(NetworkIds {
            general: "a1".into(),
            ext: "b1".into(),
            int: "c1".into()
        })
    );
    // A name that means two networks (workers that made it at once) needs the full check.
    let mut dup = all.clone();
    dup.push(listed("b0", "p_ext", Some("false")));
    assert_eq!(networks_in_place("p", &dup), None);
    // One missing, or one that lets containers reach one another.
    assert_eq!(networks_in_place("p", &all[1..]), None);
    let mut open = all.clone();
    open[0] = listed("c1", "p_int", None);
    assert_eq!(networks_in_place("p", &open), None);
    open[0] = listed("c1", "p_int", Some("true"));
    assert_eq!(networks_in_place("p", &open), None);
}
