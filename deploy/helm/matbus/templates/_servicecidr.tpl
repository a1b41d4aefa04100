{{/*
The ServiceCIDR objects of bmcServiceCIDR, checked: a list (JSON) of
{name, cidrs}, one per entry of bmcServiceCIDR.cidrs; empty unless
bmcServiceCIDR.create. An entry is one CIDR, or an IPv4 and an IPv6 CIDR
separated by a comma (one object may hold at most one CIDR per IP family).
IPv4 CIDRs are checked here (octets, prefix length, no host bits: the API
server wants the canonical form); IPv6 ones by the schema's pattern and the
API server.
*/}}
{{- define "matbus.bmcServiceCIDRs" -}}
{{- $v := .Values.bmcServiceCIDR }}
{{- $out := list }}
{{- if $v.create }}
{{- if not $v.cidrs }}
{{- fail "bmcServiceCIDR.create is true but bmcServiceCIDR.cidrs is empty: list the BMC (and NVOS) networks, e.g. {10.100.0.0/16,10.102.0.0/16}" }}
{{- end }}
{{- if not .Values.worker.serviceCIDR }}
{{- fail "bmcServiceCIDR.create is true but worker.serviceCIDR is empty: set it to the cluster's own service range (e.g. {10.96.0.0/12}); the chart adds bmcServiceCIDR.cidrs to the worker's --service-cidr, and a worker that knows only those would take every other cluster IP for one outside the service range" }}
{{- end }}
{{- $prefix := default (printf "%s-%s" (include "matbus.fullname" .) .Release.Namespace) $v.name }}
{{- $seen := dict }}
{{- range $entry := $v.cidrs }}
{{- $cidrs := list }}
{{- $families := dict }}
{{- range $c := splitList "," (toString $entry) }}
{{- $c = trim $c }}
{{- if regexMatch "^[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+/[0-9]+$" $c }}
{{- $parts := regexSplit "[./]" $c -1 }}
{{- $addr := 0 }}
{{- range $i, $o := slice $parts 0 4 }}
{{- if or (gt (atoi $o) 255) (and (gt (len $o) 1) (hasPrefix "0" $o)) }}
{{- fail (printf "bmcServiceCIDR.cidrs: %q is not an IPv4 CIDR (octet %q)" $c $o) }}
{{- end }}
{{- $addr = add (mul $addr 256) (atoi $o) }}
{{- end }}
{{- $bits := atoi (index $parts 4) }}
{{- if or (gt $bits 32) (and (gt (len (index $parts 4)) 1) (hasPrefix "0" (index $parts 4))) }}
{{- fail (printf "bmcServiceCIDR.cidrs: %q is not an IPv4 CIDR (prefix length)" $c) }}
{{- end }}
{{- $size := 1 }}
{{- range until (sub 32 $bits | int) }}{{ $size = mul $size 2 }}{{ end }}
{{- if ne (mod $addr $size) 0 }}
{{- fail (printf "bmcServiceCIDR.cidrs: %q has bits set after the /%d prefix: give the network address (the API server accepts only the canonical form)" $c $bits) }}
{{- end }}
{{- if hasKey $families "v4" }}
{{- fail (printf "bmcServiceCIDR.cidrs: %q holds two IPv4 CIDRs: a ServiceCIDR holds at most one CIDR per IP family; list them as entries of their own (one object each)" (toString $entry)) }}
{{- end }}
{{- $_ := set $families "v4" true }}
{{- else if regexMatch "^[0-9a-f:.]*:[0-9a-f:.]*/[0-9]+$" $c }}
{{- if gt (atoi (regexReplaceAll "^.*/" $c "")) 128 }}
{{- fail (printf "bmcServiceCIDR.cidrs: %q is not an IPv6 CIDR (prefix length)" $c) }}
{{- end }}
{{- if hasKey $families "v6" }}
{{- fail (printf "bmcServiceCIDR.cidrs: %q holds two IPv6 CIDRs: a ServiceCIDR holds at most one CIDR per IP family; list them as entries of their own (one object each)" (toString $entry)) }}
{{- end }}
{{- $_ := set $families "v6" true }}
{{- else }}
{{- fail (printf "bmcServiceCIDR.cidrs: %q is not a CIDR: want e.g. 10.100.0.0/16, fd00:100::/108 (lower case) or an IPv4 and an IPv6 CIDR separated by a comma" $c) }}
{{- end }}
{{- if hasKey $seen $c }}
{{- fail (printf "bmcServiceCIDR.cidrs: %q is listed twice" $c) }}
{{- end }}
{{- $_ := set $seen $c true }}
{{- $cidrs = append $cidrs $c }}
{{- end }}
{{- $name := printf "%s-%s" $prefix (join "-" $cidrs | replace "." "-" | replace ":" "-" | replace "/" "-") }}
{{- $out = append $out (dict "name" $name "cidrs" $cidrs) }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The worker's --service-cidr values: worker.serviceCIDR, then every CIDR of
the chart's ServiceCIDR objects not already in it (JSON list).
*/}}
{{- define "matbus.workerServiceCIDRs" -}}
{{- $out := list }}
{{- range .Values.worker.serviceCIDR }}
{{- $out = append $out . }}
{{- end }}
{{- range (include "matbus.bmcServiceCIDRs" . | fromJsonArray) }}
{{- range .cidrs }}
{{- if not (has . $out) }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}
