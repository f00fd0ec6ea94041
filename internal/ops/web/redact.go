package web

import (
	"net"
	"net/url"
	"strings"
)

// EndpointSecrets returns the strings that may quote a comma-separated list
// of datastore endpoints in an error, for Server.Redact: each endpoint as
// written, its host:port (or a unix socket's path), its host, and its user
// information (user:password, the user name and the password, encoded and
// decoded). Errors quote one endpoint or a dial address, never the list.
func EndpointSecrets(endpoints string) []string {
	var out []string
	for _, ep := range strings.Split(endpoints, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		out = append(out, ep)
		u, err := url.Parse(ep)
		if err != nil {
			// Not a URL: a bare host:port, which is all there is to hide.
			if host, _, err := net.SplitHostPort(ep); err == nil {
				out = append(out, host)
			}
			continue
		}
		out = append(out, u.Host, u.Hostname())
		if u.Scheme == "unix" || u.Scheme == "unixs" {
			// The socket's path: unix:///run/etcd.sock, unix://etcd.sock:0.
			out = append(out, u.Host+u.Path, u.Opaque)
		}
		if u.User != nil {
			out = append(out, u.User.String(), u.User.Username())
			if p, ok := u.User.Password(); ok {
				out = append(out, p)
			}
			if raw, _, ok := strings.Cut(u.User.String(), ":"); ok {
				out = append(out, raw)
			}
			if _, raw, ok := strings.Cut(u.User.String(), ":"); ok {
				out = append(out, raw)
			}
		}
	}
	return nonEmpty(out)
}

func nonEmpty(in []string) []string {
	var out []string
	for _, s := range in {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}
