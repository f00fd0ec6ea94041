package flow

import (
	"strconv"
	"strings"
)

// The log prefix of a policy drop names its direction and the policies
// that isolate the pod it was to or from, as nftables hands it to NFLOG:
//
//	weft drop ingress ns/a ns/b
//	weft drop egress ns/a +3      (three more policies did not fit)
//
// nftables keeps at most MaxPrefix bytes of a prefix.
const (
	prefixDrop = "weft drop "
	MaxPrefix  = 127
)

// LogPrefix is the log prefix of the drops in direction dir ("ingress" or
// "egress") of pods isolated by policies ("namespace/name", none with a
// space): as many names as fit in MaxPrefix, then "+N" for the rest.
func LogPrefix(dir string, policies []string) string {
	s := prefixDrop + dir
	for i, p := range policies {
		more := ""
		if rest := len(policies) - i - 1; rest > 0 {
			more = " +" + strconv.Itoa(rest) // room to say what is left
		}
		if len(s)+1+len(p)+len(more) > MaxPrefix {
			return s + " +" + strconv.Itoa(len(policies)-i)
		}
		s += " " + p
	}
	return s
}

// ParseLogPrefix reads a prefix LogPrefix wrote: the direction, the
// policies named and how many more were left out. ok is false for a prefix
// weft did not write.
func ParseLogPrefix(prefix string) (dir string, policies []string, more int, ok bool) {
	rest, found := strings.CutPrefix(prefix, prefixDrop)
	if !found {
		return "", nil, 0, false
	}
	f := strings.Fields(rest)
	if len(f) == 0 || f[0] != DirIngress && f[0] != DirEgress {
		return "", nil, 0, false
	}
	dir, f = f[0], f[1:]
	if n := len(f); n > 0 && strings.HasPrefix(f[n-1], "+") {
		m, err := strconv.Atoi(f[n-1][1:])
		if err != nil || m <= 0 {
			return "", nil, 0, false
		}
		more, f = m, f[:n-1]
	}
	return dir, f, more, true
}
