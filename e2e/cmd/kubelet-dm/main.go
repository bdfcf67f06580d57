// Command kubelet-dm runs the kubelet's real device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager: registration server on
// kubelet.sock, endpoints, checkpoint), the kubelet's real topology-manager
// admission path over it, and the kubelet's real PodResources v1 server, with a
// small HTTP control surface on loopback for end-to-end tests.
//
// The exported NewManagerImpl listens on the fixed path
// /var/lib/kubelet/device-plugins/kubelet.sock. So that tests never touch the
// machine's real kubelet directory, kubelet-dm re-executes itself in a private
// mount namespace and bind-mounts --root-dir over /var/lib/kubelet there. The
// bind mount is visible from the host at --root-dir, so sockets created inside
// (kubelet.sock, plugin sockets, pod-resources/kubelet.sock) can be reached from
// outside the namespace through that directory. Processes that must see the
// kubelet paths as /var/lib/kubelet can be started inside the namespace with
// POST /spawn.
//
// HTTP API (JSON):
//
//	GET    /healthz                 ok once the registration server listens
//	GET    /capacity                {"capacity":{..},"allocatable":{..},"inactive":[..],"devices":{res:{id:health}},"generation":n}
//	                                (devices: GetAllocatableDevices, i.e. the healthy ones)
//	POST   /pods                    admit a pod (topology manager "none" policy -> devicemanager.Allocate)
//	                                body {"namespace","name","uid","containers":[{"name","requests":{"kudos.dev/gpu":"1"}}]}
//	                                -> {"admitted","reason","message","containers":[{"name","envs","devices","mounts","annotations","cdi_devices"}]}
//	DELETE /pods/{uid}              the pod terminated (its devices are freed on the next reconcile)
//	POST   /restart                 stop everything, delete sockets, start again, as the kubelet does
//	POST   /spawn                   {"argv":[..],"env":{..},"log":"path"} -> {"pid"} (child inside the namespace)
//	POST   /kill                    {"pid","signal"} (signal defaults to 15)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	podresourcesv1alpha1 "k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

const kubeletDir = "/var/lib/kubelet"
const innerEnv = "KUDOS_KUBELET_DM_INNER"

func main() {
	rootDir := flag.String("root-dir", "", "host directory bind-mounted over /var/lib/kubelet in the private mount namespace (required)")
	listen := flag.String("listen", "127.0.0.1:0", "HTTP control address")
	addrFile := flag.String("addr-file", "", "write the bound HTTP address to this file once serving")
	klog.InitFlags(nil)
	flag.Parse()
	if *rootDir == "" {
		log.Fatal("--root-dir is required")
	}
	abs, err := filepath.Abs(*rootDir)
	if err != nil {
		log.Fatal(err)
	}
	if os.Getenv(innerEnv) != "1" {
		os.Exit(reexecInNamespace())
	}
	if err := bindKubeletDir(abs); err != nil {
		log.Fatalf("private /var/lib/kubelet: %v", err)
	}
	h := &harness{children: map[int]*exec.Cmd{}, pods: map[types.UID]*v1.Pod{}}
	if err := h.start(); err != nil {
		log.Fatalf("start: %v", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	if *addrFile != "" {
		tmp := *addrFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(ln.Addr().String()), 0o644); err != nil {
			log.Fatal(err)
		}
		if err := os.Rename(tmp, *addrFile); err != nil {
			log.Fatal(err)
		}
	}
	log.Printf("kubelet-dm serving on http://%s (kubelet dir %s -> %s)", ln.Addr(), abs, kubeletDir)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		h.shutdown()
		os.Exit(0)
	}()
	log.Fatal(http.Serve(ln, h.mux()))
}

// reexecInNamespace runs this program again in a new, private mount namespace
// and relays signals to it.
func reexecInNamespace() int {
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), innerEnv+"=1")
	// Go makes "/" recursively private in the child when CLONE_NEWNS is unshared.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Fatalf("re-exec in a private mount namespace (needs root/CAP_SYS_ADMIN): %v", err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	if err := cmd.Wait(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		return 1
	}
	return 0
}

func bindKubeletDir(hostDir string) error {
	if err := os.MkdirAll(hostDir, 0o750); err != nil {
		return err
	}
	// The mount point must exist; an empty directory is all this leaves on the host.
	if err := os.MkdirAll(kubeletDir, 0o750); err != nil {
		return err
	}
	if err := syscall.Mount(hostDir, kubeletDir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over %s: %w", hostDir, kubeletDir, err)
	}
	return nil
}

// === harness ===

type harness struct {
	mu         sync.Mutex
	dm         *devicemanager.ManagerImpl
	tm         topologymanager.Manager
	prServer   *grpc.Server
	generation int
	pods       map[types.UID]*v1.Pod
	children   map[int]*exec.Cmd
	stopUpd    chan struct{}
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*v1.Pod, 0, len(h.pods))
	for _, p := range h.pods {
		out = append(out, p)
	}
	return out
}

// start builds a fresh manager the way the kubelet's container manager does:
// topology manager (policy none) as the affinity store and admit handler, the
// device manager as its hint provider, then the PodResources server.
func (h *harness) start() error {
	logger := klog.Background()
	tm, err := topologymanager.NewManager(logger, nil, "none", "container", nil)
	if err != nil {
		return err
	}
	dm, err := devicemanager.NewManagerImpl(logger, nil, tm)
	if err != nil {
		return err
	}
	tm.AddHintProvider(logger, dm)
	stop := make(chan struct{})
	go func() { // the kubelet consumes resource-health updates; keep the channel drained
		for {
			select {
			case <-dm.Updates():
			case <-stop:
				return
			}
		}
	}()
	ready := config.NewSourcesReady(func(_ sets.Set[string]) bool { return true })
	if err := dm.Start(logger, h.activePods, ready, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		close(stop)
		return err
	}
	prDir := filepath.Join(kubeletDir, "pod-resources")
	prSock := filepath.Join(prDir, "kubelet.sock")
	if err := os.MkdirAll(prDir, 0o750); err != nil {
		return err
	}
	_ = os.Remove(prSock)
	ln, err := net.Listen("unix", prSock)
	if err != nil {
		return err
	}
	providers := podresources.PodResourcesProviders{
		Pods:             podsProvider{h},
		Devices:          devicesProvider{dm},
		Cpus:             noCPUs{},
		Memory:           noMemory{},
		DynamicResources: noDRA{},
	}
	srv := grpc.NewServer()
	podresourcesv1alpha1.RegisterPodResourcesListerServer(srv, podresources.NewV1alpha1PodResourcesServer(providers))
	podresourcesv1.RegisterPodResourcesListerServer(srv, podresources.NewV1PodResourcesServer(context.Background(), providers))
	go func() { _ = srv.Serve(ln) }()
	h.mu.Lock()
	h.dm, h.tm, h.prServer, h.stopUpd = dm, tm, srv, stop
	h.generation++
	h.mu.Unlock()
	return nil
}

func (h *harness) stop() {
	h.mu.Lock()
	dm, srv, stop := h.dm, h.prServer, h.stopUpd
	h.dm, h.prServer = nil, nil
	h.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	if dm != nil {
		_ = dm.Stop(klog.Background())
	}
	if stop != nil {
		close(stop)
	}
	// A stopping kubelet leaves its sockets; the next one deletes every socket
	// in device-plugins/ on start (CleanupPluginDirectory). Remove ours now too.
	_ = os.Remove(filepath.Join(kubeletDir, "device-plugins", "kubelet.sock"))
	_ = os.Remove(filepath.Join(kubeletDir, "pod-resources", "kubelet.sock"))
}

func (h *harness) shutdown() {
	h.stop()
	h.mu.Lock()
	defer h.mu.Unlock()
	for pid, c := range h.children {
		_ = c.Process.Signal(syscall.SIGTERM)
		delete(h.children, pid)
	}
}

func (h *harness) manager() (*devicemanager.ManagerImpl, topologymanager.Manager, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dm, h.tm, h.generation
}

// === HTTP ===

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

type containerSpec struct {
	Name     string            `json:"name"`
	Requests map[string]string `json:"requests"`
}

type podSpec struct {
	Namespace      string          `json:"namespace"`
	Name           string          `json:"name"`
	UID            string          `json:"uid"`
	InitContainers []containerSpec `json:"init_containers"`
	Containers     []containerSpec `json:"containers"`
}

type deviceOut struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	Permissions   string `json:"permissions"`
}

type mountOut struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	ReadOnly      bool   `json:"read_only"`
}

type containerOut struct {
	Name        string              `json:"name"`
	Envs        map[string]string   `json:"envs"`
	Devices     []deviceOut         `json:"devices"`
	Mounts      []mountOut          `json:"mounts"`
	Annotations map[string]string   `json:"annotations"`
	CDIDevices  []string            `json:"cdi_devices"`
	DeviceIDs   map[string][]string `json:"device_ids"`
}

func toContainers(specs []containerSpec) ([]v1.Container, error) {
	var out []v1.Container
	for _, c := range specs {
		rl := v1.ResourceList{}
		for k, v := range c.Requests {
			q, err := resource.ParseQuantity(v)
			if err != nil {
				return nil, fmt.Errorf("container %s: %s: %w", c.Name, k, err)
			}
			rl[v1.ResourceName(k)] = q
		}
		out = append(out, v1.Container{Name: c.Name, Resources: v1.ResourceRequirements{Requests: rl, Limits: rl}})
	}
	return out, nil
}

func (h *harness) mux() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		dm, _, _ := h.manager()
		if dm == nil {
			fail(w, 503, fmt.Errorf("stopped"))
			return
		}
		if err := dm.GetHealthChecker().Check(r); err != nil {
			fail(w, 503, err)
			return
		}
		writeJSON(w, 200, map[string]string{"status": "ok"})
	})
	m.HandleFunc("GET /capacity", func(w http.ResponseWriter, r *http.Request) {
		dm, _, gen := h.manager()
		if dm == nil {
			fail(w, 503, fmt.Errorf("stopped"))
			return
		}
		capacity, allocatable, inactive := dm.GetCapacity(klog.Background())
		cOut, aOut := map[string]int64{}, map[string]int64{}
		for k, v := range capacity {
			cOut[string(k)] = v.Value()
		}
		for k, v := range allocatable {
			aOut[string(k)] = v.Value()
		}
		devs := map[string]map[string]string{}
		for res, d := range dm.GetAllocatableDevices(klog.Background()) {
			devs[res] = map[string]string{}
			for id, dev := range d {
				devs[res][id] = dev.Health
			}
		}
		if inactive == nil {
			inactive = []string{}
		}
		writeJSON(w, 200, map[string]any{"capacity": cOut, "allocatable": aOut, "inactive": inactive, "devices": devs, "generation": gen})
	})
	m.HandleFunc("POST /pods", func(w http.ResponseWriter, r *http.Request) {
		var spec podSpec
		if err := json.NewDecoder(r.Body).Decode(&spec); err != nil {
			fail(w, 400, err)
			return
		}
		if spec.UID == "" || spec.Name == "" {
			fail(w, 400, fmt.Errorf("name and uid are required"))
			return
		}
		if spec.Namespace == "" {
			spec.Namespace = "default"
		}
		inits, err := toContainers(spec.InitContainers)
		if err != nil {
			fail(w, 400, err)
			return
		}
		conts, err := toContainers(spec.Containers)
		if err != nil {
			fail(w, 400, err)
			return
		}
		pod := &v1.Pod{}
		pod.Namespace, pod.Name, pod.UID = spec.Namespace, spec.Name, types.UID(spec.UID)
		pod.Spec.InitContainers, pod.Spec.Containers = inits, conts
		pod.Status.Phase = v1.PodRunning
		dm, tm, _ := h.manager()
		if dm == nil {
			fail(w, 503, fmt.Errorf("stopped"))
			return
		}
		// The kubelet adds the pod to its pod manager before admission, so it is active.
		h.mu.Lock()
		h.pods[pod.UID] = pod
		h.mu.Unlock()
		res := tm.Admit(r.Context(), &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: h.activePods(), Operation: lifecycle.AddOperation})
		if !res.Admit {
			h.mu.Lock()
			delete(h.pods, pod.UID)
			h.mu.Unlock()
			writeJSON(w, 200, map[string]any{"admitted": false, "reason": res.Reason, "message": res.Message})
			return
		}
		var outs []containerOut
		all := append(append([]v1.Container{}, inits...), conts...)
		for i := range all {
			c := &all[i]
			opts, err := dm.GetDeviceRunContainerOptions(r.Context(), pod, c)
			if err != nil {
				fail(w, 500, fmt.Errorf("container options for %s: %w", c.Name, err))
				return
			}
			co := containerOut{Name: c.Name, Envs: map[string]string{}, Annotations: map[string]string{}, Devices: []deviceOut{}, Mounts: []mountOut{}, CDIDevices: []string{}, DeviceIDs: map[string][]string{}}
			if opts != nil {
				for _, e := range opts.Envs {
					co.Envs[e.Name] = e.Value
				}
				for _, d := range opts.Devices {
					co.Devices = append(co.Devices, deviceOut{d.PathOnHost, d.PathInContainer, d.Permissions})
				}
				for _, mt := range opts.Mounts {
					co.Mounts = append(co.Mounts, mountOut{mt.HostPath, mt.ContainerPath, mt.ReadOnly})
				}
				for _, a := range opts.Annotations {
					co.Annotations[a.Name] = a.Value
				}
				for _, c := range opts.CDIDevices {
					co.CDIDevices = append(co.CDIDevices, c.Name)
				}
			}
			for res, devs := range dm.GetDevices(string(pod.UID), c.Name) {
				for id := range devs {
					co.DeviceIDs[res] = append(co.DeviceIDs[res], id)
				}
			}
			outs = append(outs, co)
		}
		writeJSON(w, 200, map[string]any{"admitted": true, "containers": outs})
	})
	m.HandleFunc("DELETE /pods/{uid}", func(w http.ResponseWriter, r *http.Request) {
		uid := types.UID(r.PathValue("uid"))
		h.mu.Lock()
		_, ok := h.pods[uid]
		delete(h.pods, uid)
		h.mu.Unlock()
		if dm, _, _ := h.manager(); dm != nil {
			dm.UpdateAllocatedDevices(klog.Background())
		}
		writeJSON(w, 200, map[string]bool{"deleted": ok})
	})
	m.HandleFunc("POST /restart", func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		h.stop()
		if err := h.start(); err != nil {
			fail(w, 500, err)
			return
		}
		_, _, gen := h.manager()
		writeJSON(w, 200, map[string]any{"generation": gen, "restart_ms": time.Since(t0).Milliseconds()})
	})
	m.HandleFunc("POST /spawn", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Argv []string          `json:"argv"`
			Env  map[string]string `json:"env"`
			Log  string            `json:"log"`
			Dir  string            `json:"dir"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Argv) == 0 {
			fail(w, 400, fmt.Errorf("argv required (%v)", err))
			return
		}
		cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
		cmd.Dir = req.Dir
		cmd.Env = os.Environ()
		for k, v := range req.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if req.Log != "" {
			f, err := os.OpenFile(req.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				fail(w, 400, err)
				return
			}
			defer f.Close()
			cmd.Stdout, cmd.Stderr = f, f
		}
		if err := cmd.Start(); err != nil {
			fail(w, 400, err)
			return
		}
		pid := cmd.Process.Pid
		h.mu.Lock()
		h.children[pid] = cmd
		h.mu.Unlock()
		go func() {
			_ = cmd.Wait()
			h.mu.Lock()
			delete(h.children, pid)
			h.mu.Unlock()
		}()
		writeJSON(w, 200, map[string]int{"pid": pid})
	})
	m.HandleFunc("POST /kill", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Pid    int `json:"pid"`
			Signal int `json:"signal"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			fail(w, 400, err)
			return
		}
		if req.Signal == 0 {
			req.Signal = int(syscall.SIGTERM)
		}
		h.mu.Lock()
		c, ok := h.children[req.Pid]
		h.mu.Unlock()
		if !ok {
			fail(w, 404, fmt.Errorf("no child %d", req.Pid))
			return
		}
		_ = c.Process.Signal(syscall.Signal(req.Signal))
		writeJSON(w, 200, map[string]bool{"signalled": true})
	})
	return m
}

// === providers for the PodResources server ===

type podsProvider struct{ h *harness }

func (p podsProvider) GetActivePods() []*v1.Pod { return p.h.activePods() }
func (p podsProvider) GetPods() []*v1.Pod       { return p.h.activePods() }
func (p podsProvider) GetPodByName(ns, name string) (*v1.Pod, bool) {
	for _, pod := range p.h.activePods() {
		if pod.Namespace == ns && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

type devicesProvider struct{ dm *devicemanager.ManagerImpl }

func (d devicesProvider) UpdateAllocatedDevices(l klog.Logger) { d.dm.UpdateAllocatedDevices(l) }
func (d devicesProvider) GetDevices(podUID, containerName string) []*podresourcesv1.ContainerDevices {
	return containerDevices(d.dm.GetDevices(podUID, containerName))
}
func (d devicesProvider) GetAllocatableDevices(l klog.Logger) []*podresourcesv1.ContainerDevices {
	return containerDevices(d.dm.GetAllocatableDevices(l))
}

// containerDevices is the kubelet's containerDevicesFromResourceDeviceInstances
// (pkg/kubelet/cm/container_manager.go, unexported there).
func containerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesv1.ContainerDevices {
	var out []*podresourcesv1.ContainerDevices
	for resourceName, resourceDevs := range devs {
		for devID, dev := range resourceDevs {
			topo := dev.GetTopology()
			if topo == nil {
				out = append(out, &podresourcesv1.ContainerDevices{ResourceName: resourceName, DeviceIds: []string{devID}})
				continue
			}
			for _, node := range topo.GetNodes() {
				out = append(out, &podresourcesv1.ContainerDevices{
					ResourceName: resourceName,
					DeviceIds:    []string{devID},
					Topology:     &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: node.GetID()}}},
				})
			}
		}
	}
	return out
}

type noCPUs struct{}

func (noCPUs) GetCPUs(*v1.Pod, *v1.Container) []int64 { return []int64{} }
func (noCPUs) GetPodCPUs(string) []int64              { return []int64{} }
func (noCPUs) GetAllocatableCPUs() []int64            { return []int64{} }

type noMemory struct{}

func (noMemory) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesv1.ContainerMemory {
	return nil
}
func (noMemory) GetPodMemory(klog.Logger, string) []*podresourcesv1.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory(klog.Logger) []*podresourcesv1.ContainerMemory {
	return nil
}

type noDRA struct{}

func (noDRA) GetDynamicResources(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesv1.DynamicResource {
	return nil
}
