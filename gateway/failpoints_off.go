//go:build !failpoints

package gateway

// failpointsBuilt is false in a normal build: the failpoint code is compiled
// out and its environment variables mean nothing.
const failpointsBuilt = false

func (g *Gateway) armFailpoints() {}
