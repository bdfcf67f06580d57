// Command etcd is upstream etcd's server entry point (go.etcd.io/etcd/server/v3/etcdmain),
// built at the version k8s.io/kubernetes pins, so the harness needs no other download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
