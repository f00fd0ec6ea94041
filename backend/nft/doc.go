// Package nft writes and checks weft's own nftables tables: a table is
// described as plain data (Table: its sets and its chains of commented
// rules), Check compares the kernel's copy with it rule for rule, and
// Program replaces it in one transaction, so that its rules are never
// missing while it is rewritten. backend/masq keeps its masquerade tables
// this way and backend/vxlan its filter of the VXLAN port.
//
// Counters compare equal whatever they counted, and a set lookup by the
// set's name whatever the set's id; everything else must be exactly the
// expressions wanted, in order, with the same comment.
package nft
