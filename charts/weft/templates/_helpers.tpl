{{/*
weft.image: the one image every container runs.
*/}}
{{- define "weft.image" -}}
{{ .Values.flannel.image.repository }}:{{ .Values.flannel.image.tag }}
{{- end }}

{{/*
weft.backendKeys: for each backend value of Flannel's chart, the net-conf.json
Backend field it becomes and the backends that read it.
*/}}
{{- define "weft.backendKeys" -}}
backendPort:
  vxlan: Port
  uvxlan: Port
  wireguard: ListenPort
backendPortv6:
  wireguard: ListenPortV6
mtu:
  vxlan: MTU
  uvxlan: MTU
  wireguard: MTU
vni:
  vxlan: VNI
  uvxlan: VNI
GBP:
  vxlan: GBP
directRouting:
  vxlan: DirectRouting
  uvxlan: DirectRouting
fastPath:
  vxlan: FastPath
  uvxlan: FastPath
psk:
  wireguard: PSK
tunnelMode:
  wireguard: Mode
keepaliveInterval:
  wireguard: PersistentKeepaliveInterval
{{- end }}

{{/*
weft.fastPath: "true" when weftd may run uvxlan with its fast path, and so
needs CAP_BPF: the backend is uvxlan, or vxlan (which falls back to uvxlan
on a kernel without the VXLAN driver), and fastPath is not false.
*/}}
{{- define "weft.fastPath" -}}
{{- $f := .Values.flannel -}}
{{- if and (has $f.backend (list "vxlan" "uvxlan")) (not (and (hasKey $f "fastPath") (eq (toString (index $f "fastPath")) "false"))) -}}
true
{{- end -}}
{{- end }}

{{/*
weft.netConf: net-conf.json as a dict, from podCidr, podCidrv6,
enableNFTables, backend and the backend settings that are set.
*/}}
{{- define "weft.netConf" -}}
{{- $v := .Values -}}
{{- $backend := dict "Type" $v.flannel.backend -}}
{{- range $key, $fields := include "weft.backendKeys" . | fromYaml -}}
{{- if and (hasKey $v.flannel $key) (not (kindIs "invalid" (index $v.flannel $key))) (hasKey $fields $v.flannel.backend) -}}
{{- $_ := set $backend (index $fields $v.flannel.backend) (index $v.flannel $key) -}}
{{- end -}}
{{- end -}}
{{- $conf := dict "EnableNFTables" $v.flannel.enableNFTables "Backend" $backend -}}
{{- if $v.podCidr -}}
{{- $_ := set $conf "Network" $v.podCidr -}}
{{- else -}}
{{- $_ := set $conf "EnableIPv4" false -}}
{{- end -}}
{{- if $v.podCidrv6 -}}
{{- $_ := set $conf "IPv6Network" $v.podCidrv6 -}}
{{- $_ := set $conf "EnableIPv6" true -}}
{{- end -}}
{{- toPrettyJson $conf -}}
{{- end }}

{{/*
weft.validate fails the render, with the reason, on values that have no
meaning in weft. values.schema.json has already checked types and ranges.
*/}}
{{- define "weft.validate" -}}
{{- $v := .Values -}}
{{- $f := $v.flannel -}}
{{- if hasKey $f "flannel_cni" -}}
{{- fail "flannel.flannel_cni: weft has no separate CNI plugin image; its plugin ships in flannel.image and is installed from it. Remove flannel_cni from your values." -}}
{{- end -}}
{{- if hasKey $f "macPrefix" -}}
{{- fail "flannel.macPrefix: sets VTEP MAC prefixes on Windows nodes, which weft does not run on. Remove it." -}}
{{- end -}}
{{- $netpol := $v.netpol | default dict -}}
{{- if $netpol.enabled -}}
{{- fail "netpol.enabled=true: weft's chart does not run kube-network-policies: weftd enforces NetworkPolicy itself, on by default (--network-policy); remove netpol from your values." -}}
{{- end -}}
{{- range $k, $_ := $netpol -}}
{{- if ne $k "enabled" -}}
{{- fail (printf "netpol.%s: weft's chart does not run kube-network-policies (weftd enforces NetworkPolicy itself); remove netpol.%s from your values." $k $k) -}}
{{- end -}}
{{- end -}}
{{- $b := $f.backend -}}
{{- if eq $b "udp" -}}
{{- fail "flannel.backend=udp: Flannel's udp backend is not in weft; use uvxlan, weft's VXLAN dataplane run in weftd (it speaks VXLAN to flanneld's vxlan nodes)." -}}
{{- else if eq $b "ipsec" -}}
{{- fail "flannel.backend=ipsec: Flannel's ipsec backend is not in weft; use wireguard for encrypted pod traffic." -}}
{{- else if eq $b "ipip" -}}
{{- fail "flannel.backend=ipip: Flannel's ipip backend is not in weft yet; use vxlan (Flannel's default) or host-gw (nodes on one L2 network)." -}}
{{- else if eq $b "extension" -}}
{{- fail "flannel.backend=extension: the extension backend runs commands that the chart cannot set; use kube-manifests/kube-weft.yml and write them into its net-conf.json (README.md, \"extension users\")." -}}
{{- else if not (has $b (list "vxlan" "uvxlan" "host-gw" "wireguard" "alloc")) -}}
{{- fail (printf "flannel.backend=%s: unknown; weft's chart runs vxlan, uvxlan, host-gw, wireguard or alloc." $b) -}}
{{- end -}}
{{- range $key, $fields := include "weft.backendKeys" . | fromYaml -}}
{{- if and (hasKey $f $key) (not (kindIs "invalid" (index $f $key))) (not (hasKey $fields $b)) -}}
{{- fail (printf "flannel.%s: has no meaning for backend %s (backends that read it: %s). Remove it or change flannel.backend." $key $b (keys $fields | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}
{{- $mtu := $f.mtu | default 0 | int -}}
{{- if and (gt $mtu 0) (lt $mtu 1280) -}}
{{- fail (printf "flannel.mtu %d: must be 0 (the underlay device's MTU) or between 1280 and 65535." $mtu) -}}
{{- end -}}
{{- if and (not $v.podCidr) (not $v.podCidrv6) -}}
{{- fail "podCidr and podCidrv6 are both empty: set at least one cluster network." -}}
{{- end -}}
{{- if and $v.podCidr (not (regexMatch "^[0-9]{1,3}(\\.[0-9]{1,3}){3}/[0-9]{1,2}$" $v.podCidr)) -}}
{{- fail (printf "podCidr %q: not an IPv4 CIDR such as 10.244.0.0/16." $v.podCidr) -}}
{{- end -}}
{{- if and $v.podCidrv6 (not (regexMatch "^[0-9a-fA-F:]*:[0-9a-fA-F:]*/[0-9]{1,3}$" $v.podCidrv6)) -}}
{{- fail (printf "podCidrv6 %q: not an IPv6 CIDR such as fd00:10:244::/56." $v.podCidrv6) -}}
{{- end -}}
{{- range $f.args -}}
{{- if regexMatch "^--?(health-addr|healthz-port|healthz-ip)(=|$)" . -}}
{{- fail (printf "flannel.args %q: the chart sets weftd's health address from flannel.healthz.port (the probes use it); set that instead." .) -}}
{{- end -}}
{{- end -}}
{{- if not $f.skipCNIConfigInstallation -}}
{{- $conf := fromJson $f.cniConf -}}
{{- if hasKey $conf "Error" -}}
{{- fail (printf "flannel.cniConf: not JSON: %s" $conf.Error) -}}
{{- end -}}
{{- $types := list -}}
{{- range $conf.plugins -}}
{{- $types = append $types (default "" .type) -}}
{{- end -}}
{{- if has "flannel" $types -}}
{{- fail "flannel.cniConf: a plugin of type flannel; the chart installs weft's plugin as `weft` only, so use {\"type\": \"weft\"} (its keys: plugin/README.md), or Flannel's layout in kube-manifests/flannel-compat/kube-flannel.yml." -}}
{{- end -}}
{{- if not (has "weft" $types) -}}
{{- fail "flannel.cniConf: no plugin of type weft in \"plugins\"; without it no pod is wired by weft." -}}
{{- end -}}
{{- end -}}
{{- end }}
