package main

// Sales name their time zone (IANA) for day and month limit windows; the
// binary carries the zone database so a host without /usr/share/zoneinfo
// counts them the same.
import _ "time/tzdata"
