//! The agent Deployment: its container, probes, hardening, and the volumes of its config,
//! certificate, hub CA and kubeconfig Secrets.

use std::collections::BTreeSet;

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec},
        core::v1::{
            Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
            EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector, PodSecurityContext, PodSpec,
            PodTemplateSpec, Probe, SeccompProfile, SecretVolumeSource, SecurityContext, Volume,
            VolumeMount,
        },
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};
use kube::api::ObjectMeta;
use scale_agent_crds::{ScaleAgent, v1alpha1::Mode};

use super::{
    ADMIN_PORT, AGENT_DRAIN_SECONDS, AGENT_TERMINATION_GRACE_SECONDS, CONFIG_DIR, CONFIG_KEY,
    HUB_CA_DIR, KUBECONFIG_DIR, TLS_DIR, agent_name, owned_meta, pod, selector_labels,
    tls_secret_name,
};
use crate::error::Result;

fn mount(name: &str, path: String) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path,
        read_only: Some(true),
        ..Default::default()
    }
}

fn secret_volume(name: &str, secret: &str) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The agent Deployment.
pub fn deployment(agent: &ScaleAgent, kubeconfig_secrets: &BTreeSet<String>) -> Result<Deployment> {
    let spec = &agent.spec;
    let selector = selector_labels(agent);
    let insecure = spec.hub.tls.insecure_plaintext;
    let mut volumes = vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: agent_name(agent),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
    ];
    let mut mounts = vec![
        mount("config", CONFIG_DIR.into()),
        VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        },
    ];
    if !insecure {
        volumes.push(secret_volume("tls", &tls_secret_name(agent)));
        mounts.push(mount("tls", TLS_DIR.into()));
        if let Some(ca) = &spec.hub.tls.ca_secret_ref {
            volumes.push(secret_volume("hub-ca", &ca.name));
            mounts.push(mount("hub-ca", HUB_CA_DIR.into()));
        }
    }
    if spec.mode != Mode::Agent {
        for (index, secret) in kubeconfig_secrets.iter().enumerate() {
            let name = format!("kubeconfig-{index}");
            volumes.push(secret_volume(&name, secret));
            mounts.push(mount(&name, format!("{KUBECONFIG_DIR}/{secret}")));
        }
    }
    let probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("admin".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(3),
        ..Default::default()
    };
    let field_env = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let container = Container {
        name: "agent".into(),
        image: Some(spec.image_or_default().to_owned()),
        image_pull_policy: Some(spec.image_pull_policy.as_str().to_owned()),
        args: Some(vec![
            "--config".into(),
            format!("{CONFIG_DIR}/{CONFIG_KEY}"),
        ]),
        env: Some(
            [
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
                // Set here, beside the grace period it must stay below (older agents
                // ignore it).
                EnvVar {
                    name: "SCALE_AGENT_DRAIN_TIMEOUT_SECONDS".into(),
                    value: Some(AGENT_DRAIN_SECONDS.to_string()),
                    ..Default::default()
                },
            ]
            .into_iter()
            .chain(pod::extra_env(agent))
            .collect(),
        ),
        ports: Some(vec![ContainerPort {
            name: Some("admin".into()),
            container_port: ADMIN_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(probe("/readyz", 5)),
        liveness_probe: Some(probe("/healthz", 10)),
        resources: spec.resources.clone(),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    let mut pod = PodSpec {
        service_account_name: Some(agent_name(agent)),
        // Only mode Agent talks to this cluster's API with its own token.
        automount_service_account_token: Some(spec.mode == Mode::Agent),
        containers: vec![container],
        volumes: Some(volumes),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            run_as_group: Some(65532),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        topology_spread_constraints: Some(pod::topology_spread(agent)),
        termination_grace_period_seconds: Some(AGENT_TERMINATION_GRACE_SECONDS),
        ..Default::default()
    };
    pod::place(agent, &mut pod);
    Ok(Deployment {
        metadata: owned_meta(agent, agent_name(agent))?,
        spec: DeploymentSpec {
            replicas: Some(spec.replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod::pod_labels(agent)),
                    annotations: pod::pod_annotations(agent),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        },
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::desired::tests::agent;

    #[test]
    fn deployment_is_hardened_and_probed() {
        let agent = agent("prod");
        let deployment = deployment(&agent, &BTreeSet::new()).unwrap();
        assert_eq!(
            deployment.metadata.owner_references.as_ref().unwrap()[0].uid,
            "uid-1"
        );
        let spec = deployment.spec;
        assert_eq!(spec.replicas, Some(2));
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("prod-agent"));
        assert_eq!(
            pod.topology_spread_constraints.unwrap()[0].topology_key,
            "kubernetes.io/hostname"
        );
        let container = &pod.containers[0];
        assert_eq!(
            container.args.as_ref().unwrap(),
            &["--config", "/etc/scale-agent/scale-agent.yaml"]
        );
        let security = container.security_context.as_ref().unwrap();
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(
            security.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        assert_eq!(
            container
                .readiness_probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .as_deref(),
            Some("/readyz")
        );
        assert_eq!(container.env.as_ref().unwrap()[0].name, "POD_NAME");
        // The drain on SIGTERM fits in the grace period.
        let drain = container
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == "SCALE_AGENT_DRAIN_TIMEOUT_SECONDS")
            .and_then(|e| e.value.as_deref())
            .unwrap()
            .parse::<i64>()
            .unwrap();
        let grace = pod.termination_grace_period_seconds.unwrap();
        assert!(
            drain > 0 && drain + 5 <= grace,
            "drain {drain} s, grace {grace} s"
        );
        let mounts: Vec<_> = container
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(
            mounts,
            [
                "/etc/scale-agent",
                "/tmp",
                "/var/run/scale-agent/tls",
                "/var/run/scale-agent/hub-ca"
            ]
        );
    }
}
