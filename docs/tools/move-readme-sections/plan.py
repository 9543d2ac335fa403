# Which README section goes to which page of the guide, and the corrections made on the way
# (features review C1-C10). Read by build_pages.py.
page('introduction.md', 'Scale Agent', None, [
    (R, None, (3, 26)),
    (None, '''
## Who it is for

Platform teams that run Spinnaker across many Kubernetes clusters: each target cluster gets an
operator and declares its agents and accounts as custom resources (by hand, from a GitOps
repository, or from the pipeline that builds the cluster), and the Spinnaker team runs the hub
next to Clouddriver. No inbound port is opened into a target cluster, and Secrets' contents
never leave it.

## How this guide is ordered

- **Getting started**: [the demo on a laptop](getting-started/laptop.md), then
  [a real cluster with the chart](getting-started/real-cluster.md).
- **Concepts**: [agents](concepts/agents.md), [accounts](concepts/accounts.md),
  [the hub](concepts/hub.md), [the proxy](concepts/proxy.md), [the cache](concepts/cache.md),
  [identities](concepts/identities.md), [stores and replicas](concepts/replicas.md).
- **Tasks**: connecting clusters and Spinnaker, access for people, migrating from Armory,
  replicas, rotation, upgrades.
- **Operations**: metrics, alerts and runbooks, sizing, backups.
- **Troubleshooting**: [error messages](troubleshooting/messages.md), quoted from the code.
- **Reference**: [custom resources](reference/crds.md) (generated from the types), the flags
  of each component, [the HTTP API](reference/http-api.md) and
  [the wire protocol](reference/wire-protocol.md).

Build this guide with `make book` (it installs mdBook once, from crates.io) and open
`docs/book/index.html`; `make test` builds it and checks every link.
'''),
    (R, 'Components'),
])
page('getting-started/laptop.md', 'On a laptop: the demo',
 """`make demo` runs the whole system on one machine, on a real Kubernetes control plane, and
narrates what it does. Run by a test: `e2e/tests/demo.rs`
(`demo_narrates_kubectl_through_the_hub_and_stops_everything_on_sigterm`) starts
`scale-agent-demo`, reads this narration and runs the kubectl commands it prints.""",
 [(R, 'The two commands', ('What `make test` prints',))])
page('getting-started/real-cluster.md', 'On a real cluster: images and the chart',
 """The images, then the operator in each target cluster and the hub next to Clouddriver, with
kustomize or Helm. What the tests run of this page: `e2e/tests/chart.rs` installs the chart
with the real `helm` on the test control plane (its pods are KWOK's: reported Running, no
container runs), `e2e/tests/manifests.rs` checks that Helm and kustomize render the same
objects, `e2e/tests/images.rs` runs each image's entrypoint in its own root filesystem (the
agent's image connects to a real hub), and `e2e/tests/upgrade.rs` upgrades the 0.1.0 chart as
[Upgrade](../tasks/upgrade.md) says. `e2e/tests/real_node.rs` runs the chart's pods on a real
node (kubelet, containerd, runc): the steps below, on one cluster.""",
 [(None, '''
## The path, step by step

> **Run end to end by `e2e/tests/real_node.rs`** on a real node (kubelet, containerd, runc),
> on one cluster (hub and operator in one release; this build's images imported into
> containerd instead of pushed to a registry), and with two differences a real cluster does
> not need: the hub's volume is a hostPath
> PersistentVolume the test makes (the node has no provisioner), and the agents reach the hub
> by its Service's ClusterIP with `tls.serverName` (the node runs no cluster DNS). Report
> where it stumbles.

### 1. Images

Build them and push them to a registry your clusters pull from ([Images](#images)).
With another registry, set the image repositories as [Images](#images) says.

### 2. The hub, in Spinnaker's cluster

A Secret `scale-agent-hub-tls` with the hub's serving
certificate (`tls.crt`, `tls.key`, and `ca.crt`, the CA put into the kubeconfigs the hub
hands out; cert-manager's Certificate writes these keys) for the names agents dial and
Clouddriver uses, then the chart with the hub on:

```sh
kubectl create namespace spinnaker
kubectl -n spinnaker create secret generic scale-agent-hub-tls \\
  --from-file=tls.crt=hub.crt --from-file=tls.key=hub.key --from-file=ca.crt=hub-ca.crt
helm install scale-agent manifests/helm/scale-agent -n spinnaker \\
  --set hub.enabled=true --set hub.publicUrl=https://scale-agent-hub.spinnaker.example.com:8443
```

The hub's default store is a file on a 1 GiB volume claim: the cluster needs a storage
provisioner (or set `hub.persistence.storageClassName`). Agents must reach its gRPC port
(9091) and Clouddriver and people its HTTPS port (8443).

### 3. An enrolment token

A one-time token for the agent's identity, from the hub:

```sh
kubectl -n spinnaker exec deploy/scale-agent-hub -- \\
  scale-agent-hub agent-token create --identity prod-eu-west-1 --accounts 'prod-eu-west-1*' --ttl 1h --once
```

### 4. The operator, in the target cluster

The chart, then the token and the hub's CA as Secrets:

```sh
helm install scale-agent manifests/helm/scale-agent -n scale-agent-system --create-namespace
kubectl -n scale-agent-system create secret generic prod-enrolment --from-literal=token=<token>
kubectl -n scale-agent-system create secret generic hub-ca --from-file=ca.crt=hub-ca.crt
```

When Spinnaker's cluster is also a target, the release of step 2 already runs the operator:
skip the `helm install` here (a second release on the same cluster fails on the admission
policy the first one owns; issue 27).

### 5. A ScaleAgent and its AgentAccounts

For instance `manifests/examples/agent-mode.yaml`
(below, as it is in the repository; edit `spec.hub.address` to the hub's gRPC address, and
create namespaces `team-a` and `team-b` or change the scope). `access: Deploy` is reserved to
cluster administrators by the admission policy ([Identities](../concepts/identities.md)):

```yaml
{{#include ../../../manifests/examples/agent-mode.yaml}}
```

```sh
kubectl -n scale-agent-system apply -f agent-mode.yaml
kubectl -n scale-agent-system wait --for=condition=Connected agentaccount/prod-eu-west-1 --timeout=5m
```

If it does not connect, the AgentAccount's conditions say why
([Error messages](../troubleshooting/messages.md)).

### 6. kubectl through the hub

A kubeconfig for the account, from the hub, and kubectl with it:

```sh
kubectl -n spinnaker exec deploy/scale-agent-hub -- scale-agent-hub kubeconfig --account prod-eu-west-1 > prod.kubeconfig
KUBECONFIG=prod.kubeconfig kubectl get deploy -A
```

Then [connect Spinnaker](../tasks/connect-spinnaker.md).
'''), (R, 'Images'), (R, 'Manifests and chart')])

page('concepts/agents.md', 'Agents', None, [
    (A, 'agent/', None, True) if False else (A, None, (3, 7)),
    (A, 'What it sends'), (A, 'Operations'), (A, 'Kubernetes API proxy requests'),
    (A, "Secret data and the agent's memory")])
page('concepts/accounts.md', 'Accounts', None, [
    (A, 'Status in the cluster'), (H, 'Behaviour'), (A, 'Dynamic accounts'), (H, 'Dynamic accounts')])
page('concepts/hub.md', 'The hub', None, [(H, None, (3, 23))])
page('concepts/proxy.md', 'The Kubernetes API proxy', None, [
    (None, '''
A request through the proxy, as the sections below describe it:

```
 kubectl / Helm / Clouddriver                hub                                  target cluster
 (kubeconfig from the hub:     ┌────────────────────────────────┐
  server https://<hub>/        │ /clusters/<account>/...        │
  clusters/<account>,          │  a token of this account? no ──┼─▶ 401, 403
  a token of that account) ───▶│  LIST/GET/WATCH of a kind the  │
                               │  agent streams, cache synced? ─┼─▶ answered from the cache
                               │  anything else (writes, Secret │
                               │  data, exec, Tables, ...) ─────┼─▶ exchange on the agent's ──▶ agent replays it
                               └────────────────────────────────┘   own gRPC stream              as its ServiceAccount
                                                                                                 against the API server
```
'''),
    (H, 'Kubernetes API proxy', ('Reads from the cache', 'Watches from the cache', 'Tokens and kubeconfigs'))])
page('concepts/cache.md', 'The cache', None, [
    (H, 'Reads from the cache'), (H, 'Watches from the cache'), (H, 'The write path')])
page('concepts/identities.md', 'Identities and security', None, [
    (H, 'Security model', ('Refusals',)), (H, 'Agent identity and enrolment'), (O, 'Security')])
page('concepts/replicas.md', 'Stores and replicas', None, [
    (None, '''
One replica with the embedded store (the default), or several on PostgreSQL. Two agent
replicas of account `prod` reach different hub replicas; the replica that holds the account's
lock streams it, the other agent stands by, and a request for `prod` reaching any other
replica is forwarded to the owner:

```
 agent pods of prod       hub replicas                           PostgreSQL
 ┌──────────────┐       ┌──────────────────────────────┐      ┌───────────────────────────┐
 │ prod agent-0 │──────▶│ replica 1: holds prod's lock,│─────▶│ one advisory lock per     │
 └──────────────┘       │ streams it, serves its cache │      │ account (its owner), and  │
 ┌──────────────┐       ├──────────────────────────────┤      │ what replicas share:      │
 │ prod agent-1 │──────▶│ replica 2: agent-1 stands by;│─────▶│ bindings, tokens, resume  │
 └──────────────┘       │ prod's requests forwarded ──▶│ 1    │ points, cached objects,   │
                        ├──────────────────────────────┤      │ operation records         │
 kubectl, Clouddriver ─▶│ replica 3: forwards to 1     │─────▶│                           │
                        └──────────────────────────────┘      └───────────────────────────┘
```
'''),
    (H, 'Stores'), (H, 'Several replicas')])

page('tasks/connect-a-cluster.md', 'Connect a cluster', None, [
    (R, 'Is the account connected? (what a provisioning pipeline waits on)'),
    (A, 'Authenticating to the hub')])
page('tasks/connect-spinnaker.md', 'Connect Spinnaker', None, [
    (R, 'Spinnaker, kubectl and Helm through the hub'), (H, 'Clouddriver registration')])
page('tasks/give-people-access.md', 'Give people access', None, [
    (H, 'People and teams'), (H, 'Tokens and kubeconfigs'), (H, 'Authentication and roles')])
page('tasks/migrate-from-armory.md', 'Migrate from Armory', None, [
    (A, 'Migrating from Armory: `scale-agent migrate`'), (A, 'Armory keys')])
page('tasks/run-three-replicas.md', 'Run three hub replicas', None, [(None, '''
> Three replicas survive the loss of a replica's process (tested with SIGKILL); a frozen or
> cut-off replica keeps its accounts until PostgreSQL drops its session (issue 29): see
> [Stores and replicas](../concepts/replicas.md#stores).
'''), (C, 'A highly available hub')])
page('tasks/grpc-proxy.md', 'Put a gRPC proxy in front of the hub', None, [(H, 'Behind a TLS-terminating gRPC proxy')])
page('tasks/egress-proxy.md', 'Run agents behind an egress proxy', None, [(A, 'Egress proxy')])
page('tasks/rotate.md', 'Rotate certificates and tokens', None, [
    (None, '''
## The hub's serving certificates
'''),
    (H, None, (159, 169)),
    (None, '''
## Agents' client certificates

Nothing to do by hand: a certificate the hub issued is renewed over the agent's stream, or by
the operator for the agents it runs, before it expires (agents renew at 2/3 of
`--agent-cert-lifetime`, 720h by default); the ScaleAgent's status shows the identity and the
expiry. How enrolment and renewal work: [Identities](../concepts/identities.md#agent-identity-and-enrolment).
Revoking a certificate before it expires is not built: see the same page.

## Tokens

Issuing a token again under the same name replaces it, so the old one stops working:

- an API token: `scale-agent-hub token create --name <name> --role <role>`
  ([reference](../reference/command-line.md#scale-agent-hub-token-create));
- a person's or a pipeline's proxy token: `scale-agent-hub kubeconfig --account <account>
  --token-name <name>` ([reference](../reference/command-line.md#scale-agent-hub-kubeconfig));
- Clouddriver's token for an account: `scale-agent-hub kubeconfig --account <account>
  --token-name clouddriver --rotate` (the hub registers the account again with the new one).

Agent tokens are not replaced by name: issue a new one with `scale-agent-hub agent-token create`
and revoke the old one with `agent-token revoke <id>` (ids from `agent-token list`). A token is
revoked with `scale-agent-hub token revoke <id>` ([Give people access](give-people-access.md));
until issue 28 closes its finding F2, revoking a Clouddriver token (`--token-name clouddriver`)
does not stick: the hub derives the same token again within a second.

Not covered here: rotating the hub's agent CA (`--agent-ca-cert`, `--agent-ca-key`, read only at
start-up): no procedure is written or tested yet.
'''),
])
page('tasks/upgrade.md', 'Upgrade', None, [(C, 'CRDs and upgrades')])

page('troubleshooting/refusals.md', 'Every refusal, by component', None, [(H, 'Refusals')])
page('operations/metrics.md', 'Metrics and health', None, [(None, '''
Each component serves Prometheus metrics named `scale_agent_<component>_<what>` and health
endpoints; the chart's ServiceMonitors, PodMonitor, alerts and dashboard are in
[Monitoring, alerts and runbooks](monitoring.md). Where each component's metrics are listed:

- the hub: `GET /metrics` on its HTTPS listener, behind a `reader` token unless
  `--metrics-unauthenticated` ([HTTP API](../reference/http-api.md#http-api));
- the operator: `/metrics`, `/healthz` and `/readyz` on `--metrics-address`
  ([Operator reference](../reference/operator.md#running));
- the agent: its admin port, below.
'''), (A, 'Admin port')])
page('operations/sizing.md', 'Sizing', None, [(None, '''
## What the figures say for sizing

Every figure below is from the benchmark that follows (`make bench`, a 2-core machine, release
builds; the measure number in brackets). They are measurements of one machine, not
guarantees: size with headroom, and measure on yours with `make bench` and its size flags.

- **Hub memory grows with the objects it caches**: about 0.7 to 1.3 KB of RSS per cached object
  of about 1 KB of JSON (10,000 ConfigMaps: 1304 B per object 1 s after the sync, 1016 B 3 s
  after, 681 B per object between 1,000 and 10,000 objects) over a base of about 15 to 19 MiB
  before any agent connects [5, 7]. So the objects' JSON size summed over every account is a
  fair first estimate of the hub's memory for the cache.
- **Each connected agent** costs the hub about 89 KiB of RSS (200 simulated agents, one account
  and 5 objects each) [7]; 1,000 simulated agents registered with one hub in 1.5 s.
- **Agents are small**: 26.8 MiB of RSS watching 10,000 ConfigMaps, 18.4 MiB idle with 10 kinds,
  and under 0.1 % of a core idle [5]. The initial LIST is the memory peak; the ScaleAgent's
  list budget caps concurrent LISTs ([reference](../reference/crds.md)).
- **One stream keeps up with its API server**: at saturation the hub ingested 1064 events/s
  while the API server accepted 1066 creates/s; the stream alone, from a synthetic source,
  86,289 events/s on 2 cores [2].
- **Clouddriver's caching cycles do not reach the target clusters**: a cycle of 10,000 objects
  over 8 kinds sent 0 LISTs to the API server through the proxy against 24 directly, and 100
  accounts' cycles at once cost the hub 0.27 CPU s [9].
- **Leave memory headroom on the hub**: its RSS still grows slowly in the 10-minute soak of
  1,000 simulated agents (103.5 to 156.8 MiB; the cause is not yet known) [10].

Not measured yet: more than 1,000 agents on one hub and fleets of millions of objects under
Clouddriver's read load (issue 26's fleet benchmark measures them).
'''), (R, 'Benchmarks')])

page('operations/high-availability.md', 'High availability: what fails, what happens, what you see', None, [
    (R, 'High availability: what fails, what happens, what you see', (), True)])
page('status.md', 'Status: what works today', None, [(R, 'Status', (), True)])

page('reference/hub.md', 'Hub: flags and commands', None, [(H, 'Running')])
page('reference/agent.md', 'Agent: flags and config file', None, [
    (A, 'Running it', ('Migrating from Armory: `scale-agent migrate`', 'Status in the cluster', 'Authenticating to the hub')),
    (A, 'Config file', ('Dynamic accounts', 'Armory keys'))])
page('reference/operator.md', 'Operator: what it makes, RBAC, status, flags', None, [
    (O, 'What it makes for ScaleAgent `<name>` in namespace `<ns>`'), (O, 'RBAC by access level'),
    (O, 'Status'), (O, 'Running')])
page('reference/http-api.md', 'HTTP API and operations', None, [
    (R, 'Operations API (what Spinnaker uses to deploy)'), (H, 'HTTP API'), (H, 'Operations')])

page('contributing/development.md', 'Development: the control plane, tests and layout', None, [
    (R, 'What `make test` prints'), (R, 'The local control plane'), (R, 'Tests'), (R, 'Workspace layout'),
    (H, 'Architecture'), (H, 'Embedding (tests)'), (H, 'Tests'), (A, 'In-process use (tests)'), (O, 'Library')])

FIXES = {}
C7 = ("\n\n> **Which states a CR shows** (features review C7): the hub tells an account's state only to "
      "the streams serving it or rejected for it. `INACTIVE` and `ORPHANED` mean no agent serves the "
      "account, so no agent writes them: the CR keeps the last state it was told, typically `ACTIVE` "
      "beside `Connected=False` (`HubUnreachable`). Read `INACTIVE` and `ORPHANED` from the hub's "
      "`/api/v1/accounts`; only `ACTIVE` on a CR is asserted by a test (`e2e/tests/operator.rs`).\n")
FIXES = {
 'introduction.md': [(
  "through which\nunmodified Clouddriver, kubectl and Helm reach every cluster, without an inbound port into any\ncluster.",
  "through which\nkubectl and Helm reach every cluster, without an inbound port into any cluster; Clouddriver,\n"
  "which only runs kubectl, reaches it the same way (its command forms are tested with the real\n"
  "kubectl; its registration against a contract written from Clouddriver's source, not a running\n"
  "Clouddriver: see [Connect Spinnaker](tasks/connect-spinnaker.md)).")],
 'concepts/hub.md': [(
  "so kubectl, client-go, Helm and unmodified\n  Clouddriver (which only runs kubectl) use every cluster",
  "so kubectl, client-go, Helm and\n  Clouddriver's kubectl commands (tested with the real kubectl, not a running Clouddriver) use every cluster")],
 'reference/agent.md': [(
  "`kubeconfigFile` may also name a key of a Secret in Spinnaker's secret-engine form,\n`encryptedFile:k8s!n:<secret>!k:<key>`",
  "In a config file `kubeconfigFile` must be a path: the secret-engine form `encryptedFile:…` is\n"
  "refused at start-up (features review C2). Only an account the hub pushes (a dynamic account)\n"
  "may name a key of a Secret in Spinnaker's secret-engine form,\n`encryptedFile:k8s!n:<secret>!k:<key>`")],
 'concepts/replicas.md': [(
  "`postgres` when the hub must survive a replica or node failure without a pause, with a\nPostgreSQL you already operate (backups, failover) behind it.",
  "`postgres` when the hub must survive the loss of a replica process, with a PostgreSQL you\n"
  "already operate (backups, failover) behind it. A replica that dies (its process killed) frees\n"
  "its accounts at once; a replica that is frozen, or a node that is cut off, keeps its accounts\n"
  "for as long as PostgreSQL keeps its session (no keepalive or lease is set yet; features review\n"
  "C3, issue 29). The shipped default is one replica with a volume (`Recreate`); three replicas\n"
  "need the PostgreSQL store ([Run three hub replicas](../tasks/run-three-replicas.md)).")],
 'reference/operator.md': [(
  "An account without `kinds` watches everything: RBAC cannot\n  subtract, so that is",
  "An account without `kinds` is granted more than the agent watches\n  (the agent watches its default kinds; features review C6): RBAC cannot subtract, so the grant is")],
 'tasks/connect-a-cluster.md': [(
  "time of the last event. `kubectl get scaleagents`",
  "time of the last event (see the note below). `kubectl get scaleagents`"),
  ("`e2e/tests/operator.rs`) runs this\n`kubectl wait` and `kubectl get` against a real agent and hub.",
   "`e2e/tests/operator.rs`) runs this\n`kubectl wait` and `kubectl get` against a real agent and hub." + C7)],
 'concepts/accounts.md': [(
  "`status.hub`: the hub's state of the account (`ACTIVE`, `INACTIVE`,\n  `FAILED`, `ORPHANED`) and its reason",
  "`status.hub`: the hub's state of the account as the hub last told a\n  connected agent (`ACTIVE`, `FAILED`; `INACTIVE` and `ORPHANED` are not written, see\n  [Connect a cluster](../tasks/connect-a-cluster.md)) and its reason")],
 'tasks/migrate-from-armory.md': [(
  "Unset: the default kinds above (Armory: everything)",
  "Unset: the agent's default kinds ([reference](../reference/agent.md)) (Armory's Clouddriver plugin sends its `cacheDefaults` kinds at registration)")],
}
