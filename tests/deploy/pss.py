"""Kubernetes' Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards,
policy version v1.32), "baseline" and "restricted", as the admission controller applies them to
a pod template: each check returns the violations it finds, worded like the controller's.
Written from that page (the admission plugin itself is Go, with no offline Python equivalent)."""

from __future__ import annotations

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


def pod_templates(manifests: list[dict]) -> dict[str, dict]:
    """kind/name -> the pod spec of every workload (CronJobs' too)."""
    found = {}
    for doc in manifests:
        if doc["kind"] in WORKLOADS:
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc["spec"]["template"]
        elif doc["kind"] == "CronJob":
            found[f"CronJob/{doc['metadata']['name']}"] = doc["spec"]["jobTemplate"]["spec"]["template"]
    return found


def _containers(spec: dict) -> list[dict]:
    return [c for key in ("initContainers", "containers", "ephemeralContainers") for c in spec.get(key) or []]


def baseline(template: dict) -> list[str]:
    spec, meta = template["spec"], template.get("metadata") or {}
    bad = []
    psc = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            bad.append(f"host namespaces ({field}=true)")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        bad.append("hostProcess")
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            bad.append(f"hostPath volumes ({volume['name']})")
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
                value == "runtime/default" or value.startswith("localhost/")):
            bad.append(f"forbidden AppArmor profile ({key}={value})")
    for sysctl in psc.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            bad.append(f"forbidden sysctls ({sysctl['name']})")
    for where, sc in [("pod", psc)] + [(c["name"], c.get("securityContext") or {}) for c in _containers(spec)]:
        if sc.get("privileged"):
            bad.append(f"privileged ({where})")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            bad.append(f"seccompProfile ({where} must not set securityContext.seccompProfile.type to \"Unconfined\")")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            bad.append(f"forbidden AppArmor profile ({where})")
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            bad.append(f"seLinuxOptions ({where})")
        if where != "pod":
            if sc.get("procMount", "Default") != "Default":
                bad.append(f"procMount ({where})")
            added = set((sc.get("capabilities") or {}).get("add") or [])
            if added - BASELINE_CAPS:
                bad.append(f"non-default capabilities ({where}: {', '.join(sorted(added - BASELINE_CAPS))})")
    for container in _containers(spec):
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                bad.append(f"hostPort ({container['name']}: {port['hostPort']})")
    return bad


def restricted(template: dict) -> list[str]:
    spec = template["spec"]
    bad = baseline(template)
    psc = spec.get("securityContext") or {}
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"restricted volume types ({volume['name']}: {', '.join(sorted(kinds))})")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for container in _containers(spec):
        name, sc = container["name"], container.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"allowPrivilegeEscalation != false ({name})")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            bad.append(f"runAsNonRoot != true ({name})")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            bad.append(f"runAsUser=0 ({name})")
        if (sc.get("seccompProfile") or {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost"):
            bad.append(f"seccompProfile ({name} must set securityContext.seccompProfile.type to "
                       "\"RuntimeDefault\" or \"Localhost\")")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"unrestricted capabilities ({name} must drop ALL)")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"unrestricted capabilities ({name} adds more than NET_BIND_SERVICE)")
    if psc.get("runAsUser") == 0:
        bad.append("runAsUser=0 (pod)")
    return bad
