package flows

import (
	"context"
	"net"
	"net/http"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/ops/lab"
)

// LabEndpoints are the lab's nodes, each reached on lab.HealthAddr inside
// its namespace, and the lab pods' names; close releases the namespaces.
func LabEndpoints(st *lab.State) ([]Endpoint, Names, func(), error) {
	var eps []Endpoint
	var opened []*namespace.NS
	closeAll := func() {
		for _, ns := range opened {
			ns.Handle.Close()
		}
	}
	for _, n := range st.Nodes {
		ns, err := lab.OpenNS(n.NS)
		if err != nil {
			closeAll()
			return nil, nil, nil, err
		}
		opened = append(opened, ns)
		eps = append(eps, Endpoint{Node: n.Name, Client: InNamespace(ns), Base: "http://" + lab.HealthAddr})
	}
	names := Names{}
	for _, p := range st.Pods {
		names[p.IP] = p.Name
	}
	return eps, names, closeAll, nil
}

// InNamespace is an HTTP client whose connections are made in ns (without
// a timeout: long polls wait).
func InNamespace(ns *namespace.NS) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := ns.Do(func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
}
