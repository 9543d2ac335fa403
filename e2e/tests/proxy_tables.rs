//! Tables from the hub's cache (issue 30), on a real control plane with real kubectl 1.37,
//! 1.29 and 1.22: `kubectl get` of every built-in kind the hub prints and of a custom
//! resource with printer columns, plain, `-o wide`, `--show-labels`, `-L`, `--sort-by`,
//! paged and by name, prints the same through the proxy as directly; `kubectl get -w` and
//! Table streaming lists with bookmarks of every kind give the same events; and the API
//! server's own audit log shows that the proxied reads never reached it.
//!
//! Ages: the API server and the hub each print ages at the moment they answer, so the AGE
//! column (and a restart's "(5m ago)") can tick between the direct run and the proxied one.
//! Rather than masking them, each comparison samples direct, proxied, direct again and
//! requires the proxied output to equal one of the two direct ones exactly, sampling again
//! (at most [`SAMPLES`] times) only when a second boundary fell between the runs.

use std::time::Duration;

use scale_agent_e2e::{
    fixtures,
    kubectl::Kubectl,
    proxy_stack::{ProxyStack, args, audited_control_plane, ensure_ok},
};
use serde_json::json;

/// The objects the test prints, seeded as the admin.
#[path = "proxy_tables/seed.rs"]
mod seed;
use seed::seed;
#[path = "proxy_tables/bookmarks.rs"]
mod bookmarks;
#[path = "proxy_tables/seed_cluster.rs"]
mod seed_cluster;
#[path = "proxy_tables/seed_groups.rs"]
mod seed_groups;
#[path = "proxy_tables/watch.rs"]
mod watch;
use seed_cluster::seed_cluster_kinds;
use seed_groups::seed_group_kinds;

const KUBECTL_TIMEOUT: Duration = Duration::from_secs(90);
const WAIT: Duration = Duration::from_secs(120);
/// How many times a comparison samples both sides before it fails.
const SAMPLES: usize = 6;

/// The namespaced kinds the test prints (one `kubectl get` of all of them at once).
const NAMESPACED: &[&str] = &[
    "deployments",
    "replicasets",
    "statefulsets",
    "daemonsets",
    "jobs",
    "cronjobs",
    "services",
    "ingresses",
    "configmaps",
    "serviceaccounts",
    "persistentvolumeclaims",
    "networkpolicies",
    "roles",
    "rolebindings",
    "poddisruptionbudgets",
    "horizontalpodautoscalers",
    "events",
    "pods",
    "podtemplates",
    "replicationcontrollers",
    "endpoints",
    "endpointslices",
    "resourcequotas",
    "leases",
    "controllerrevisions",
    "events.events.k8s.io",
    "resourceclaims",
    "resourceclaimtemplates",
    "limitranges",
    "csistoragecapacities",
];
/// Cluster-scoped kinds, besides the CRDs the agent streams for the printer columns.
const CLUSTER: &[&str] = &[
    "namespaces",
    "nodes",
    "clusterroles",
    "clusterrolebindings",
    "persistentvolumes",
    "storageclasses",
    "volumeattachments",
    "csidrivers",
    "csinodes",
    "priorityclasses",
    "runtimeclasses",
    "ingressclasses",
    "certificatesigningrequests",
    "validatingwebhookconfigurations",
    "mutatingwebhookconfigurations",
    "customresourcedefinitions",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicybindings",
    "flowschemas",
    "prioritylevelconfigurations",
    "volumeattributesclasses",
    "clustertrustbundles",
    "deviceclasses",
    "resourceslices",
    "devicetaintrules",
    "storageversionmigrations",
];
/// Cluster-scoped kinds printed by name: the API server's own ServiceCIDR and the seeded
/// Service's cluster IP (the IPAddress the API server allocated for it).
const BY_NAME: &[&str] = &["servicecidrs", "ipaddresses"];
/// Cluster-scoped kinds printed whole (with their API server's own selection), each with
/// the path the cache answers them at.
const UNLABELLED: &[(&str, &str)] =
    &[("apiservices", "/apis/apiregistration.k8s.io/v1/apiservices")];

struct Setup {
    stack: ProxyStack,
    /// The label every object of the test carries (`tables=<id>`).
    label: String,
    widget_group: String,
    /// The cluster IP of the seeded Service `web`: the name of its IPAddress.
    web_ip: String,
}

impl Setup {
    async fn new() -> anyhow::Result<Setup> {
        fixtures::init_logs("warn,scale_agent_hub_proxy=info");
        let identity = ProxyStack::identity("tables").await?;
        let namespace = identity.namespace.clone();
        let label = format!("tables={namespace}");
        let widget_group = format!("{}.example.com", identity.home);
        seed(
            identity.control_plane,
            &identity.dir,
            &namespace,
            &widget_group,
        )
        .await?;
        seed_cluster_kinds(
            identity.control_plane,
            &identity.dir,
            &namespace,
            &widget_group,
        )
        .await?;
        seed_group_kinds(
            identity.control_plane,
            &identity.dir,
            &namespace,
            &widget_group,
        )
        .await?;
        let web = kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(
            identity.admin.clone(),
            &namespace,
        )
        .get("web")
        .await?;
        let web_ip = web
            .spec
            .and_then(|s| s.cluster_ip)
            .ok_or_else(|| anyhow::anyhow!("the Service web has no cluster IP"))?;
        let account = identity.account_name();
        let mut kinds: Vec<String> = NAMESPACED
            .iter()
            .chain(CLUSTER)
            .chain(BY_NAME)
            .chain(UNLABELLED.iter().map(|(k, _)| k))
            .map(|k| k.to_string())
            .collect();
        kinds.push(format!("widgets.{widget_group}"));
        let stack = identity
            .start(account, json!({ "kinds": kinds }), "tables-0", "tables")
            .await?;
        let setup = Setup {
            stack,
            label,
            widget_group,
            web_ip,
        };
        setup.wait_synced().await?;
        Ok(setup)
    }

    /// Waits until the cache answers a Table of every kind the test prints.
    async fn wait_synced(&self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + WAIT;
        for path in &self.paths() {
            loop {
                let reply = self
                    .stack
                    .hub
                    .call("GET", &format!("/clusters/{}{path}", self.stack.account))
                    .bearer(&self.stack.token)
                    .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
                    .timeout(KUBECTL_TIMEOUT)
                    .send()
                    .await?;
                if reply.status == 200 && reply.header("x-scale-agent-cache") == Some("hit") {
                    let table = reply.json_or_null();
                    anyhow::ensure!(table["kind"] == "Table", "{path}: {table}");
                    break;
                }
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "the cache never answered a Table of {path}: {} {:?} {}",
                    reply.status,
                    reply.header("x-scale-agent-cache"),
                    reply.body
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// The collection of every kind the test prints, narrowed to the test's objects: the
    /// test's namespace, its label for cluster-scoped kinds (the aggregator's own
    /// APIServices, the `kubernetes` ServiceCIDR and the Service's IPAddress by name).
    fn paths(&self) -> Vec<String> {
        let ns = &self.stack.namespace;
        let selector = format!("?labelSelector=tables%3D{ns}");
        let mut paths: Vec<String> = vec![
            format!("/apis/{}/v1/namespaces/{ns}/widgets", self.widget_group),
            "/apis/apiregistration.k8s.io/v1/apiservices\
             ?labelSelector=kube-aggregator.kubernetes.io%2Fautomanaged%3Donstart"
                .into(),
            "/apis/networking.k8s.io/v1/servicecidrs?fieldSelector=metadata.name%3Dkubernetes"
                .into(),
            format!(
                "/apis/networking.k8s.io/v1/ipaddresses?fieldSelector=metadata.name%3D{}",
                self.web_ip
            ),
        ];
        for path in [
            "/api/v1/namespaces",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            "/api/v1/nodes",
            "/api/v1/persistentvolumes",
            "/apis/storage.k8s.io/v1/storageclasses",
            "/apis/storage.k8s.io/v1/volumeattachments",
            "/apis/storage.k8s.io/v1/csidrivers",
            "/apis/storage.k8s.io/v1/csinodes",
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            "/apis/node.k8s.io/v1/runtimeclasses",
            "/apis/networking.k8s.io/v1/ingressclasses",
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
            "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies",
            "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings",
            "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas",
            "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations",
            "/apis/storage.k8s.io/v1/volumeattributesclasses",
            "/apis/certificates.k8s.io/v1/clustertrustbundles",
            "/apis/resource.k8s.io/v1/deviceclasses",
            "/apis/resource.k8s.io/v1/resourceslices",
            "/apis/resource.k8s.io/v1/devicetaintrules",
            "/apis/storagemigration.k8s.io/v1/storageversionmigrations",
        ] {
            paths.push(format!("{path}{selector}"));
        }
        for (group, resource) in [
            ("apps/v1", "deployments"),
            ("apps/v1", "replicasets"),
            ("apps/v1", "statefulsets"),
            ("apps/v1", "daemonsets"),
            ("batch/v1", "jobs"),
            ("batch/v1", "cronjobs"),
            ("", "services"),
            ("networking.k8s.io/v1", "ingresses"),
            ("", "configmaps"),
            ("", "serviceaccounts"),
            ("", "persistentvolumeclaims"),
            ("networking.k8s.io/v1", "networkpolicies"),
            ("rbac.authorization.k8s.io/v1", "roles"),
            ("rbac.authorization.k8s.io/v1", "rolebindings"),
            ("policy/v1", "poddisruptionbudgets"),
            ("autoscaling/v2", "horizontalpodautoscalers"),
            ("", "events"),
            ("", "pods"),
            ("", "podtemplates"),
            ("", "replicationcontrollers"),
            ("", "endpoints"),
            ("discovery.k8s.io/v1", "endpointslices"),
            ("", "resourcequotas"),
            ("coordination.k8s.io/v1", "leases"),
            ("apps/v1", "controllerrevisions"),
            ("events.k8s.io/v1", "events"),
            ("resource.k8s.io/v1", "resourceclaims"),
            ("resource.k8s.io/v1", "resourceclaimtemplates"),
            ("", "limitranges"),
            ("storage.k8s.io/v1", "csistoragecapacities"),
        ] {
            paths.push(if group.is_empty() {
                format!("/api/v1/namespaces/{ns}/{resource}")
            } else {
                format!("/apis/{group}/namespaces/{ns}/{resource}")
            });
        }
        paths
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.stack.stop().await
    }

    /// The `kubectl get` forms compared, each with its arguments.
    fn commands(&self) -> Vec<Vec<String>> {
        let ns = self.stack.namespace.as_str();
        let kinds = format!("{},widgets.{}", NAMESPACED.join(","), self.widget_group);
        let cluster = CLUSTER.join(",");
        let mut commands = Vec::new();
        for extra in [
            &[][..],
            &["-o", "wide"],
            &["--show-labels"],
            &["-L", "app", "-L", "tier"],
        ] {
            let mut c = args(&["get", &kinds, "-n", ns]);
            c.extend(args(extra));
            commands.push(c);
            let mut c = args(&["get", &cluster, "-l", &self.label]);
            c.extend(args(extra));
            commands.push(c);
            // The API server's own ServiceCIDR and the Service's IPAddress, by name.
            for (kind, name) in [
                ("servicecidr", "kubernetes"),
                ("ipaddress", self.web_ip.as_str()),
            ] {
                let mut c = args(&["get", kind, name]);
                c.extend(args(extra));
                commands.push(c);
            }
            // The aggregator's own APIServices (a set no test changes).
            for (kind, _) in UNLABELLED {
                let mut c = args(&[
                    "get",
                    kind,
                    "-l",
                    "kube-aggregator.kubernetes.io/automanaged=onstart",
                ]);
                c.extend(args(extra));
                commands.push(c);
            }
        }
        // `--sort-by` (includeObject=Object) one kind at a time: over several kinds at once
        // kubectl fails the same way against the API server ("couldn't find any field").
        for kind in [
            "pods",
            "deployments",
            "services",
            "configmaps",
            "rolebindings",
            "events",
            &format!("widgets.{}", self.widget_group),
        ] {
            commands.push(args(&["get", kind, "-n", ns, "--sort-by=.metadata.name"]));
        }
        commands.push(args(&[
            "get",
            "pods",
            "-n",
            ns,
            "--sort-by=.status.podIP",
            "-o",
            "wide",
        ]));
        commands.push(args(&[
            "get",
            "namespaces",
            "-l",
            &self.label,
            "--sort-by=.metadata.name",
        ]));
        commands.push(args(&["get", "pod", "running", "-n", ns]));
        commands.push(args(&["get", "pod", "running", "-n", ns, "-o", "wide"]));
        commands.push(args(&["get", "deployment", "web", "-n", ns, "-o", "wide"]));
        commands.push(args(&[
            "get",
            &format!("widgets.{}", self.widget_group),
            "w-1",
            "-n",
            ns,
        ]));
        // Pages of 2 (limit and continue through the Table).
        commands.push(args(&["get", "configmaps", "-n", ns, "--chunk-size=2"]));
        commands.push(args(&["get", "pods", "-n", ns, "-l", "app=web"]));
        commands
    }
}

/// Resource reads (not discovery) the API server received as the agent's identity from
/// kubectl, after `skip` audit events.
fn kubectl_reads(user: &str, skip: usize) -> anyhow::Result<(usize, Vec<String>)> {
    let events = audited_control_plane()?.audit_events()?;
    let total = events.len();
    let reads = events
        .into_iter()
        .skip(skip)
        .filter(|e| e.user.username == user)
        .filter(|e| e.verb == "list" || e.verb == "get")
        .filter(|e| e.user_agent.starts_with("kubectl"))
        .filter(|e| {
            let path = e.request_uri.split('?').next().unwrap_or_default();
            let segments = path.trim_start_matches('/').split('/').count();
            // `/api/v1/<resource>` and deeper, `/apis/<g>/<v>/<resource>` and deeper.
            (path.starts_with("/api/") && segments >= 3)
                || (path.starts_with("/apis/") && segments >= 4)
        })
        .map(|e| format!("{} {} ({})", e.verb, e.request_uri, e.user_agent))
        .collect();
    Ok((total, reads))
}

/// Every `kubectl get` form of every printed kind, with kubectl 1.37, 1.29 and 1.22: the
/// same output through the proxy as directly, and no proxied read reaches the API server.
#[tokio::test]
async fn kubectl_get_tables_equal_the_api_servers() -> anyhow::Result<()> {
    let setup = Setup::new().await?;
    let binaries = audited_control_plane()?.binaries();
    let clients = [
        ("1.37", binaries.kubectl()),
        ("1.29", binaries.kubectl_client(29)),
        ("1.22", binaries.kubectl_client(22)),
    ];
    let commands = setup.commands();
    for (version, binary) in &clients {
        let direct = Kubectl::new(
            binary.clone(),
            setup.stack.dir.join(format!("home-direct-{version}")),
        );
        let proxy = Kubectl::new(
            binary.clone(),
            setup.stack.dir.join(format!("home-proxy-{version}")),
        );
        // Served from the cache: every proxied form once, the API server's audit log
        // watched meanwhile (discovery warms up first: kubectl caches it).
        ensure_ok(
            "discovery through the proxy",
            &proxy
                .run(
                    &setup.stack.proxied,
                    &args(&["api-resources"]),
                    None,
                    KUBECTL_TIMEOUT,
                )
                .await?,
        )?;
        let (before, _) = kubectl_reads(&setup.stack.user, 0)?;
        let mut printed = String::new();
        for command in &commands {
            let outcome = proxy
                .run(&setup.stack.proxied, command, None, KUBECTL_TIMEOUT)
                .await?;
            if !outcome.success() {
                // The exchange, for the failure's message.
                let mut verbose = command.clone();
                verbose.push("-v=8".into());
                let trace = proxy
                    .run(&setup.stack.proxied, &verbose, None, KUBECTL_TIMEOUT)
                    .await?;
                let direct_run = direct
                    .run(&setup.stack.direct, command, None, KUBECTL_TIMEOUT)
                    .await?;
                anyhow::bail!(
                    "kubectl {version} {} failed through the proxy: {}\n{}\ndirectly: {:?} {}{}",
                    command.join(" "),
                    outcome.stderr,
                    trace.stderr,
                    direct_run.code,
                    direct_run.stdout,
                    direct_run.stderr
                );
            }
            printed.push_str(&outcome.stdout);
        }
        // What the cells computed from the seeded statuses look like (so that the
        // comparison below compares something).
        for expected in [
            "3 (",
            "12 (12",
            "m ago)",
            "CrashLoopBackOff",
            "2/3",
            "a.example.com,b.example.com,d.example.com + 2 more...",
            "203.0.113.10,lb.example.com",
            "Role/reader",
            "ann, bob",
            "app=web,tier notin (cache,db)",
            "large",
            "CREATED AT",
            "NotReady,SchedulingDisabled",
            "control-plane,edge",
            "cpu: 45%/80%, <unknown>/1k + 1 more...",
            "pod/running",
            "Back-off restarting failed container",
            "deployment-controller, kcm-1",
            // The cluster's other kinds.
            "daemonset.apps/node-agent",
            "limits.cpu: 500m/4",
            "pods: 3/20, requests.memory: 0/1Gi",
            "10.1.2.3:8080,10.1.2.4:8080,10.1.2.3:9090 + 2 more...",
            "80,443,3000 + 1 more...",
            "RWO,RWX",
            "RecyclerFailed",
            "WaitForFirstConsumer",
            "vault,api",
            "Persistent,Ephemeral",
            "IngressParameters.k8s.example.com/external-lb",
            "example.com/tables",
            "Approved",
            "120m",
            "runsc",
            "kcm-1",
            "tables.example.com/controller, controller-1",
            "Synced the web deployment",
            "v1(storage)",
            "Local",
            // The groups ported last.
            "v1/ConfigMap",
            "&LabelSelector{MatchLabels:map[string]string{app: web,},MatchExpressions:[]LabelSelectorRequirement{LabelSelectorRequirement{Key:tier,Operator:In,Values:[front back],},},}",
            "-queued",
            "ByUser",
            "9000",
            "example.com/tables",
            "gpu.example.com",
            "pool-a",
            "example.com/broken",
            "NoSchedule",
            "pending",
            "Succeeded",
            "services/",
        ] {
            anyhow::ensure!(
                printed.contains(expected),
                "kubectl {version}: no {expected:?} in what the proxy printed:\n{printed}"
            );
        }
        let (_, reached) = kubectl_reads(&setup.stack.user, before)?;
        anyhow::ensure!(
            reached.is_empty(),
            "kubectl {version}: proxied Table reads reached the API server:\n{}",
            reached.join("\n")
        );
        // The same output both ways.
        let (before_direct, _) = kubectl_reads(&setup.stack.user, 0)?;
        for command in &commands {
            let mut last = None;
            for _ in 0..SAMPLES {
                let first = direct
                    .run(&setup.stack.direct, command, None, KUBECTL_TIMEOUT)
                    .await?;
                let proxied = proxy
                    .run(&setup.stack.proxied, command, None, KUBECTL_TIMEOUT)
                    .await?;
                let second = direct
                    .run(&setup.stack.direct, command, None, KUBECTL_TIMEOUT)
                    .await?;
                ensure_ok(&format!("kubectl {version} direct"), &first)?;
                ensure_ok(&format!("kubectl {version} through the proxy"), &proxied)?;
                if proxied.stdout == first.stdout || proxied.stdout == second.stdout {
                    last = None;
                    break;
                }
                last = Some((first.stdout, proxied.stdout));
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            if let Some((direct_out, proxied_out)) = last {
                anyhow::bail!(
                    "kubectl {version} {}: the proxy printed\n{proxied_out}\nthe API server\n{direct_out}",
                    command.join(" ")
                );
            }
        }
        // The control: the same filter sees the direct reads, so an empty result above
        // means the proxied ones were answered by the hub.
        let (_, direct_reads) = kubectl_reads(&setup.stack.user, before_direct)?;
        anyhow::ensure!(
            direct_reads.len() >= commands.len(),
            "kubectl {version}: the audit log shows only {} direct reads for {} commands",
            direct_reads.len(),
            commands.len()
        );
        watch::kubectl_get_watch_equal(&setup, version, binary).await?;
    }
    // Streaming lists in Table form, bookmarks included, of every kind.
    bookmarks::table_streaming_lists_equal(&setup, &setup.paths()).await?;
    // A Table watch from the hub directly: an ADDED Table per object, the columns in the
    // first only, with or without bookmarks; one whose rows carry whole objects and that
    // allows bookmarks is tunnelled (the API server's bookmark rows carry the empty object
    // as its Go type writes it).
    let configmaps = format!(
        "/clusters/{}/api/v1/namespaces/{}/configmaps?watch=true&timeoutSeconds=2&labelSelector=tables%3D{}",
        setup.stack.account, setup.stack.namespace, setup.stack.namespace
    );
    for (extra, who) in [
        ("", "hit"),
        ("&allowWatchBookmarks=true", "hit"),
        ("&allowWatchBookmarks=true&includeObject=Object", "tunnel"),
    ] {
        let reply = setup
            .stack
            .hub
            .call("GET", &format!("{configmaps}{extra}"))
            .bearer(&setup.stack.token)
            .header(
                "accept",
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
            )
            .timeout(KUBECTL_TIMEOUT)
            .send()
            .await?;
        assert_eq!(
            (reply.status, reply.header("x-scale-agent-cache")),
            (200, Some(who)),
            "{extra}: {}",
            reply.body
        );
        let events: Vec<serde_json::Value> = reply
            .body
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        // The API server may add a BOOKMARK to the tunnelled one.
        let added = events.iter().filter(|e| e["type"] == "ADDED").count();
        assert_eq!(added, 5, "{}", reply.body);
        assert!(
            events.iter().all(|e| e["object"]["kind"] == "Table"),
            "{}",
            reply.body
        );
        assert_eq!(events[0]["object"]["columnDefinitions"][1]["name"], "Data");
        assert_eq!(
            events[1]["object"]["columnDefinitions"],
            serde_json::Value::Null
        );
        assert_eq!(
            events[0]["object"]["rows"].as_array().map(Vec::len),
            Some(1)
        );
    }
    // The Table itself, includeObject and v1beta1, from the hub directly.
    let path = format!(
        "/clusters/{}/api/v1/namespaces/{}/pods?includeObject=Object&limit=1",
        setup.stack.account, setup.stack.namespace
    );
    let reply = setup
        .stack
        .hub
        .call("GET", &path)
        .bearer(&setup.stack.token)
        .header(
            "accept",
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
        )
        .send()
        .await?;
    assert_eq!(reply.header("x-scale-agent-cache"), Some("hit"));
    let table = reply.json_or_null();
    assert_eq!(table["apiVersion"], "meta.k8s.io/v1beta1", "{table}");
    assert_eq!(table["rows"].as_array().map(Vec::len), Some(1), "{table}");
    assert_eq!(table["rows"][0]["object"]["kind"], "Pod", "{table}");
    assert!(
        table["metadata"]["continue"].as_str().is_some(),
        "a limited Table list continues: {table}"
    );
    let kubectl_accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let pods = format!(
        "/clusters/{}/api/v1/namespaces/{}/pods",
        setup.stack.account, setup.stack.namespace
    );
    for (query, status, who) in [
        // No objects in the rows.
        ("?includeObject=None", 200, "hit"),
        // The API server's 400 for a value it does not know, through the tunnel.
        ("?includeObject=Everything", 400, "tunnel"),
        // A Table GET of a missing object: the API server's 404, from the cache.
        ("/missing", 404, "hit"),
    ] {
        let reply = setup
            .stack
            .hub
            .call("GET", &format!("{pods}{query}"))
            .bearer(&setup.stack.token)
            .header("accept", kubectl_accept)
            .send()
            .await?;
        assert_eq!(
            (reply.status, reply.header("x-scale-agent-cache")),
            (status, Some(who)),
            "{query}: {}",
            reply.body
        );
        if query.ends_with("None") {
            let table = reply.json_or_null();
            assert_eq!(
                table["rows"][0]["object"],
                serde_json::Value::Null,
                "{table}"
            );
            assert_eq!(table["rows"].as_array().map(Vec::len), Some(3), "{table}");
        }
    }
    setup.stop().await
}
