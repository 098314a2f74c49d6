//! A third test application, on the pod network: `web`, three busybox web servers as a
//! StatefulSet. The other two run on the host's network (their members need addresses that
//! survive a restart, and the node has no DNS), which NetworkPolicy cannot cut; this one is what
//! `partition` is shown to work on, cut off and healed by the node's NetworkPolicy engine.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::json;
use shakedown::node::config::BUSYBOX_IMAGE;

pub const NS: &str = "web";

/// The app profile of `web`: every replica serves; `partition` probes a replica's port 8080 from
/// another one; `partition-groups` cuts web-0 and web-1 apart (web-2 in neither); `pod-failure` puts a replica on the node's pause image (its command, `sh`, is
/// not there: the container cannot start). (`timeout`, not wget's `-T`: Debian 12's busybox-static 1.35 `wget -T` segfaults.)
pub const PROFILE: &str = r#"
namespace = "web"
statefulset = "web"
op_timeout = "30s"

[[probes]]
name = "every replica serves"
selector = "app=web"
command = ["sh", "-c", "timeout 2 wget -q -O - http://127.0.0.1:8080/ | grep -q ok"]

[partition]
command = ["sh", "-c", "timeout 2 wget -q -O /dev/null http://{ip}:8080/"]

[[partition.groups]]
a = "statefulset.kubernetes.io/pod-name=web-0"
b = "statefulset.kubernetes.io/pod-name=web-1"

[pod_failure]
image = "shakedown.local/pause:3.4"
duration = "3s"
"#;

pub async fn deploy(client: &Client) {
    super::create_namespace(client, NS).await;
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3, "serviceName": "web", "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "web", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www"],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                    }],
                },
            },
        },
    }))
    .unwrap();
    Api::<StatefulSet>::namespaced(client.clone(), NS).create(&PostParams::default(), &sts).await.unwrap();
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(90);
    while api.get("web").await.ok().and_then(|s| s.status).and_then(|s| s.ready_replicas).unwrap_or(0) < 3 {
        assert!(Instant::now() < deadline, "web: 3 Ready replicas not within 90s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
