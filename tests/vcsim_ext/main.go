// upsguard-vcsim: govmomi's vCenter simulator with the behaviour an orderly-shutdown test needs.
//
// Stock vcsim (v0.46.3) lacks ShutdownHost_Task, shuts guests down at once even without
// VMware Tools, and enters maintenance mode at once with VMs running. This program embeds
// vcsim's simulator package and routes a few methods to its own handlers:
//
//   - ShutdownHost_Task: InvalidState unless the host is in maintenance mode or force is set;
//     the host then goes poweredOff/notResponding and a HostShutdownEvent is posted. Its task
//     carries vSphere's descriptionId (HostSystem.shutdown) and sits in the host's recentTask;
//     -method-delay 'ShutdownHost:MS' makes it take MS before the host goes down.
//   - ShutdownGuest: ToolsUnavailable unless guest.toolsRunningStatus is guestToolsRunning;
//     the guest takes -guest-shutdown-ms (or the VM's extraConfig upsguard.guestShutdownMs,
//     where "hang" means it never shuts down, and "held" that it starts to once a test
//     posted /upsguard/release-guests) before the VM is poweredOff; meanwhile
//     guest.guestState reads shuttingDown, as Tools report it (running / notRunning else).
//   - EnterMaintenanceMode_Task: completes only once no ordinary VM on the host runs (vCLS
//     VMs are powered off, as vSphere does), or fails with Timedout after its timeout.
//   - PowerOnVM_Task / PowerOffVM_Task: VMware Tools follow the power state (running
//     -tools-boot-ms after power-on, unless extraConfig upsguard.tools is "none").
//   - ExitMaintenanceMode_Task: as stock, plus the property update and event stock vcsim omits.
//   - POST /upsguard/release-guests: the guests "held" shut down from now on (a test's step
//     that catches a shutdown at a moment of its choosing, however slow the machine).
//   - POST /upsguard/host-power-on?name=HOST: a BMC stand-in that powers a shut-down host
//     back on after -host-boot-ms; it reconnects still in maintenance mode, as ESXi does.
//   - Authorization: -user NAME:PASSWORD (repeatable) adds logins beside -username, and
//     HasPrivilegeOnEntities / HasPrivilegeOnEntity answer from the roles and permissions set
//     through the API (AddAuthorizationRole, SetEntityPermissions), as vCenter does: the most
//     specific permission naming the session's user wins, inherited ones only when they
//     propagate. Stock vcsim grants every privilege to everyone; a user named in no
//     permission still is granted everything, so tests that set none see stock behaviour.
//
// Flags are those of vcsim plus the ones above; -vcls N adds N vCLS VMs per cluster.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"

	_ "github.com/vmware/govmomi/vapi/simulator"
)

const (
	toolsRunning    = string(types.VirtualMachineToolsRunningStatusGuestToolsRunning)
	toolsNotRunning = string(types.VirtualMachineToolsRunningStatusGuestToolsNotRunning)
	// guest.guestState as VMware Tools report it
	guestRunning      = string(types.VirtualMachineGuestStateRunning)
	guestShuttingDown = string(types.VirtualMachineGuestStateShuttingDown)
	guestNotRunning   = string(types.VirtualMachineGuestStateNotRunning)
)

var (
	guestShutdown  = flag.Int("guest-shutdown-ms", 0, "time a guest OS takes to shut down")
	toolsBoot      = flag.Int("tools-boot-ms", 0, "time from power-on until VMware Tools run")
	hostBoot       = flag.Int("host-boot-ms", 0, "time the BMC stand-in takes to boot a host")
	toolsDefault   = flag.Bool("tools", true, "VMware Tools run in every powered-on VM at start")
	vclsPerCluster = flag.Int("vcls", 0, "vCLS system VMs per cluster")
)

// guestsReleased is closed by POST /upsguard/release-guests: held guests wait for it.
var (
	guestsReleased = make(chan struct{})
	releaseOnce    sync.Once
)

func init() {
	flag.Var(&extraUsers, "user", "another login, NAME:PASSWORD (repeatable)")
}

// ext receives the methods routed away from vcsim's own objects. There is one per real
// object, made on demand and never put in the registry: vcsim locks the handler object
// around each call, so a single shared receiver would serialize every VM's call.
type ext struct {
	Self types.ManagedObjectReference
}

func (e *ext) Reference() types.ManagedObjectReference { return e.Self }

var routed = map[string]bool{
	"ShutdownHost_Task": true, "ShutdownGuest": true, "EnterMaintenanceMode_Task": true,
	"PowerOnVM_Task": true, "PowerOffVM_Task": true, "ExitMaintenanceMode_Task": true,
	"HasPrivilegeOnEntities": true, "HasPrivilegeOnEntity": true,
	"ReconfigureComputeResource_Task": true,
}

// logins is -user: NAME:PASSWORD pairs that may log in beside -username.
type logins []string

func (l *logins) String() string     { return strings.Join(*l, ",") }
func (l *logins) Set(v string) error { *l = append(*l, v); return nil }

var extraUsers logins

// validLogin accepts -username/-password and every -user.
func validLogin(main *url.Userinfo) func(*types.Login) bool {
	return func(req *types.Login) bool {
		if main != nil {
			if pass, _ := main.Password(); req.UserName == main.Username() && req.Password == pass {
				return true
			}
		}
		for _, pair := range extraUsers {
			if name, pass, _ := strings.Cut(pair, ":"); req.UserName == name && req.Password == pass {
				return true
			}
		}
		return false
	}
}

// granted is what the user's permissions give on entity: the roles of the permissions on the
// nearest entity (itself, then its parents) that name the user, inherited ones only when they
// propagate. named is false when no permission anywhere names the user.
func granted(ctx *simulator.Context, am *simulator.AuthorizationManager, user string,
	entity types.ManagedObjectReference) (privileges map[string]bool, named bool) {
	all := am.RetrieveAllPermissions(&types.RetrieveAllPermissions{This: am.Self})
	for _, p := range all.(*methods.RetrieveAllPermissionsBody).Res.Returnval {
		named = named || (!p.Group && strings.EqualFold(p.Principal, user))
	}
	if !named {
		return nil, false
	}
	privileges = map[string]bool{}
	ref, own := entity, true
	for i := 0; i < 32; i++ {
		res := am.RetrieveEntityPermissions(&types.RetrieveEntityPermissions{This: am.Self, Entity: ref})
		var roles []int32
		for _, p := range res.(*methods.RetrieveEntityPermissionsBody).Res.Returnval {
			if !p.Group && strings.EqualFold(p.Principal, user) && (own || p.Propagate) {
				roles = append(roles, p.RoleId)
			}
		}
		if len(roles) > 0 {
			for _, role := range am.RoleList {
				for _, id := range roles {
					if role.RoleId == id {
						for _, priv := range role.Privilege {
							privileges[priv] = true
						}
					}
				}
			}
			return privileges, true
		}
		obj, ok := ctx.Map.Get(ref).(mo.Entity)
		if !ok || obj.Entity().Parent == nil {
			break
		}
		ref, own = *obj.Entity().Parent, false
	}
	return privileges, true
}

func availability(ctx *simulator.Context, am *simulator.AuthorizationManager,
	entity types.ManagedObjectReference, ids []string) []types.PrivilegeAvailability {
	user := ""
	if ctx.Session != nil {
		user = ctx.Session.UserName
	}
	privileges, named := granted(ctx, am, user, entity)
	var out []types.PrivilegeAvailability
	for _, id := range ids {
		out = append(out, types.PrivilegeAvailability{PrivId: id, IsGranted: !named || privileges[id]})
	}
	return out
}

func (e *ext) HasPrivilegeOnEntities(ctx *simulator.Context, req *types.HasPrivilegeOnEntities) soap.HasFault {
	am := ctx.Map.Get(req.This).(*simulator.AuthorizationManager)
	var res []types.EntityPrivilege
	for _, entity := range req.Entity {
		res = append(res, types.EntityPrivilege{Entity: entity, PrivAvailability: availability(ctx, am, entity, req.PrivId)})
	}
	return &methods.HasPrivilegeOnEntitiesBody{Res: &types.HasPrivilegeOnEntitiesResponse{Returnval: res}}
}

func (e *ext) HasPrivilegeOnEntity(ctx *simulator.Context, req *types.HasPrivilegeOnEntity) soap.HasFault {
	am := ctx.Map.Get(req.This).(*simulator.AuthorizationManager)
	var res []bool
	for _, a := range availability(ctx, am, req.Entity, req.PrivId) {
		res = append(res, a.IsGranted)
	}
	return &methods.HasPrivilegeOnEntityBody{Res: &types.HasPrivilegeOnEntityResponse{Returnval: res}}
}

var proxies sync.Map // real object value -> *ext

// route is the Registry.Handler: it sends the methods above to the object's proxy. The request
// body keeps the real object in its This field, which is how the handlers find it.
func route(ctx *simulator.Context, m *simulator.Method) (mo.Reference, types.BaseMethodFault) {
	if !routed[m.Name] || ctx.Session == nil {
		return nil, nil // without a session vcsim answers NotAuthenticated naming m.This
	}
	ref := types.ManagedObjectReference{Type: "UpsguardExtension", Value: m.This.Type + ":" + m.This.Value}
	proxy, _ := proxies.LoadOrStore(ref.Value, &ext{Self: ref})
	m.This = ref
	return proxy.(*ext), nil
}

// bg is a context for work that outlives the request (a guest shutting down, a host booting).
func bg(ctx *simulator.Context) *simulator.Context {
	return &simulator.Context{Context: context.Background(), Session: ctx.Session, Map: ctx.Map}
}

func post(ctx *simulator.Context, events ...types.BaseEvent) {
	m := ctx.Map.EventManager()
	ctx.WithLock(m, func() {
		for _, ev := range events {
			m.PostEvent(ctx, &types.PostEvent{EventToPost: ev})
		}
	})
}

func datacenterOf(r *simulator.Registry, ref types.ManagedObjectReference) *types.DatacenterEventArgument {
	for i := 0; i < 16; i++ {
		obj, ok := r.Get(ref).(mo.Entity)
		if !ok {
			return nil
		}
		if dc, ok := obj.(*simulator.Datacenter); ok {
			return &types.DatacenterEventArgument{
				Datacenter:          dc.Self,
				EntityEventArgument: types.EntityEventArgument{Name: dc.Name},
			}
		}
		parent := obj.Entity().Parent
		if parent == nil {
			return nil
		}
		ref = *parent
	}
	return nil
}

func hostEvent(r *simulator.Registry, h *simulator.HostSystem) types.HostEvent {
	return types.HostEvent{Event: types.Event{
		Datacenter: datacenterOf(r, h.Self),
		Host: &types.HostEventArgument{
			Host: h.Self, EntityEventArgument: types.EntityEventArgument{Name: h.Name},
		},
	}}
}

func vmEvent(r *simulator.Registry, vm *simulator.VirtualMachine) types.VmEvent {
	ev := types.VmEvent{Event: types.Event{
		Datacenter: datacenterOf(r, vm.Self),
		Vm: &types.VmEventArgument{
			Vm: vm.Self, EntityEventArgument: types.EntityEventArgument{Name: vm.Name},
		},
	}}
	if vm.Runtime.Host != nil {
		if h, ok := r.Get(*vm.Runtime.Host).(*simulator.HostSystem); ok {
			ev.Host = &types.HostEventArgument{
				Host: h.Self, EntityEventArgument: types.EntityEventArgument{Name: h.Name},
			}
		}
	}
	return ev
}

// extra reads a VM's extraConfig value, or "" when it is not set.
func extra(vm *simulator.VirtualMachine, key string) string {
	if vm.Config == nil {
		return ""
	}
	for _, opt := range vm.Config.ExtraConfig {
		if v := opt.GetOptionValue(); v.Key == key {
			return fmt.Sprint(v.Value)
		}
	}
	return ""
}

func isSystemVM(vm *simulator.VirtualMachine) bool {
	return strings.HasPrefix(vm.Name, "vCLS") || extra(vm, "HDCS.agent") == "true"
}

func methodDelay(name string) {
	if ms := simulator.TaskDelay.MethodDelay[name]; ms > 0 {
		time.Sleep(time.Duration(ms) * time.Millisecond)
	}
}

// asyncTask returns a task at once and finishes it when work returns; work runs without
// holding the entity's lock, so that reads of the entity are not blocked while it waits.
// name is vcsim's task name (the key of -method-delay); descriptionId is vSphere's, when it
// differs from the one vcsim derives from name (ENTITY.name).
func asyncTask(ctx *simulator.Context, entity mo.Reference, name, descriptionId string,
	work func(*simulator.Context) types.BaseMethodFault) types.ManagedObjectReference {
	task := simulator.CreateTask(entity, name, nil)
	if descriptionId != "" {
		task.Info.DescriptionId = descriptionId
	}
	c := bg(ctx)
	c.Map.AtomicUpdate(c, task, []types.PropertyChange{
		{Name: "info.startTime", Val: time.Now()},
		{Name: "info.state", Val: types.TaskInfoStateRunning},
	})
	go func() {
		methodDelay(task.Info.Name)
		fault := work(c)
		changes := []types.PropertyChange{
			{Name: "info.completeTime", Val: time.Now()},
			{Name: "info.state", Val: types.TaskInfoStateSuccess},
		}
		if fault != nil {
			changes[1].Val = types.TaskInfoStateError
			changes = append(changes, types.PropertyChange{Name: "info.error", Val: types.LocalizedMethodFault{
				Fault: fault, LocalizedMessage: strings.TrimPrefix(fmt.Sprintf("%T", fault), "*types."),
			}})
		}
		c.Map.AtomicUpdate(c, task, changes)
	}()
	return task.Self
}

// toolsOff is the Tools status of a VM whose guest is not running: not running, or not
// installed at all for VMs marked upsguard.tools=none.
func toolsOff(vm *simulator.VirtualMachine) types.VirtualMachineToolsStatus {
	if extra(vm, "upsguard.tools") == "none" {
		return types.VirtualMachineToolsStatusToolsNotInstalled
	}
	return types.VirtualMachineToolsStatusToolsNotRunning
}

func setTools(ctx *simulator.Context, vm *simulator.VirtualMachine, running bool) {
	status, tools, guest := toolsNotRunning, toolsOff(vm), guestNotRunning
	if running {
		status, tools, guest = toolsRunning, types.VirtualMachineToolsStatusToolsOk, guestRunning
	}
	ctx.WithLock(vm, func() {
		ctx.Update(vm, []types.PropertyChange{
			{Name: "guest.toolsRunningStatus", Val: status},
			{Name: "guest.toolsStatus", Val: tools},
			{Name: "guest.guestState", Val: guest},
		})
	})
}

// powerOffNow is the end of a guest shutdown or of a host going down under a VM.
func powerOffNow(ctx *simulator.Context, vm *simulator.VirtualMachine) bool {
	changed := false
	ctx.WithLock(vm, func() {
		if vm.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOff {
			return
		}
		changed = true
		ctx.Update(vm, []types.PropertyChange{
			{Name: "runtime.powerState", Val: types.VirtualMachinePowerStatePoweredOff},
			{Name: "summary.runtime.powerState", Val: types.VirtualMachinePowerStatePoweredOff},
			{Name: "guest.toolsRunningStatus", Val: toolsNotRunning},
			{Name: "guest.toolsStatus", Val: toolsOff(vm)},
			{Name: "guest.guestState", Val: guestNotRunning},
		})
	})
	if changed {
		post(ctx, &types.VmPoweredOffEvent{VmEvent: vmEvent(ctx.Map, vm)})
	}
	return changed
}

func (e *ext) ShutdownGuest(ctx *simulator.Context, req *types.ShutdownGuest) soap.HasFault {
	body := &methods.ShutdownGuestBody{}
	vm, ok := ctx.Map.Get(req.This).(*simulator.VirtualMachine)
	if !ok {
		body.Fault_ = simulator.Fault("", &types.ManagedObjectNotFound{Obj: req.This})
		return body
	}
	var fault types.BaseMethodFault
	var hang, held bool
	var delay time.Duration
	ctx.WithLock(vm, func() {
		if vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn {
			fault = &types.InvalidPowerState{
				RequestedState: types.VirtualMachinePowerStatePoweredOn,
				ExistingState:  vm.Runtime.PowerState,
			}
			return
		}
		if vm.Guest == nil || vm.Guest.ToolsRunningStatus != toolsRunning {
			fault = &types.ToolsUnavailable{}
			return
		}
		delay = time.Duration(*guestShutdown) * time.Millisecond
		switch v := extra(vm, "upsguard.guestShutdownMs"); v {
		case "":
		case "hang":
			hang = true
		case "held":
			held = true
		default:
			if ms, err := strconv.Atoi(v); err == nil {
				delay = time.Duration(ms) * time.Millisecond
			}
		}
	})
	if fault != nil {
		msg := fmt.Sprintf("%T", fault)
		if _, ok := fault.(*types.ToolsUnavailable); ok {
			msg = fmt.Sprintf("VMware Tools are not running in %s", vm.Name)
		}
		body.Fault_ = simulator.Fault(msg, fault)
		return body
	}
	ctx.WithLock(vm, func() {
		ctx.Update(vm, []types.PropertyChange{{Name: "guest.guestState", Val: guestShuttingDown}})
	})
	post(ctx, &types.VmGuestShutdownEvent{VmEvent: vmEvent(ctx.Map, vm)})
	if !hang {
		c := bg(ctx)
		go func() {
			if held {
				<-guestsReleased
			}
			time.Sleep(delay)
			powerOffNow(c, vm)
		}()
	}
	body.Res = new(types.ShutdownGuestResponse)
	return body
}

func (e *ext) PowerOffVMTask(ctx *simulator.Context, req *types.PowerOffVM_Task) soap.HasFault {
	vm, ok := ctx.Map.Get(req.This).(*simulator.VirtualMachine)
	if !ok {
		return &methods.PowerOffVM_TaskBody{Fault_: simulator.Fault("", &types.ManagedObjectNotFound{Obj: req.This})}
	}
	var res soap.HasFault
	ctx.WithLock(vm, func() { res = vm.PowerOffVMTask(ctx, req) })
	if body, ok := res.(*methods.PowerOffVM_TaskBody); ok && body.Res != nil {
		followTask(bg(ctx), body.Res.Returnval, func(c *simulator.Context) { setTools(c, vm, false) })
	}
	return res
}

// ReconfigureComputeResourceTask is stock vcsim's, plus vSphere HA's host monitoring
// (dasConfig.hostMonitoring), which stock vcsim leaves out of a cluster's configuration.
func (e *ext) ReconfigureComputeResourceTask(ctx *simulator.Context, req *types.ReconfigureComputeResource_Task) soap.HasFault {
	c, ok := ctx.Map.Get(req.This).(*simulator.ClusterComputeResource)
	if !ok {
		return &methods.ReconfigureComputeResource_TaskBody{Fault_: simulator.Fault("", &types.ManagedObjectNotFound{Obj: req.This})}
	}
	var res soap.HasFault
	ctx.WithLock(c, func() {
		spec, isEx := req.Spec.(*types.ClusterConfigSpecEx)
		if isEx && spec.DasConfig != nil && spec.DasConfig.HostMonitoring != "" {
			c.ConfigurationEx.(*types.ClusterConfigInfoEx).DasConfig.HostMonitoring = spec.DasConfig.HostMonitoring
		}
		res = c.ReconfigureComputeResourceTask(ctx, req)
	})
	return res
}

func (e *ext) PowerOnVMTask(ctx *simulator.Context, req *types.PowerOnVM_Task) soap.HasFault {
	vm, ok := ctx.Map.Get(req.This).(*simulator.VirtualMachine)
	if !ok {
		return &methods.PowerOnVM_TaskBody{Fault_: simulator.Fault("", &types.ManagedObjectNotFound{Obj: req.This})}
	}
	if h := hostOf(ctx, vm); h != nil && h.Runtime.PowerState != types.HostSystemPowerStatePoweredOn {
		return &methods.PowerOnVM_TaskBody{Fault_: simulator.Fault(
			fmt.Sprintf("host %s is not powered on", h.Name), &types.InvalidHostState{})}
	}
	var res soap.HasFault
	ctx.WithLock(vm, func() { res = vm.PowerOnVMTask(ctx, req) })
	body, ok := res.(*methods.PowerOnVM_TaskBody)
	if !ok || body.Res == nil || extra(vm, "upsguard.tools") == "none" {
		return res
	}
	boot := time.Duration(*toolsBoot) * time.Millisecond
	if v, err := strconv.Atoi(extra(vm, "upsguard.toolsBootMs")); err == nil {
		boot = time.Duration(v) * time.Millisecond
	}
	followTask(bg(ctx), body.Res.Returnval, func(c *simulator.Context) {
		time.Sleep(boot)
		if vm.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOn {
			setTools(c, vm, true)
		}
	})
	return res
}

// followTask runs then once a vcsim task has succeeded.
func followTask(ctx *simulator.Context, ref types.ManagedObjectReference, then func(*simulator.Context)) {
	task, ok := ctx.Map.Get(ref).(*simulator.Task)
	if !ok {
		return
	}
	go func() {
		task.Wait()
		if task.Info.State == types.TaskInfoStateSuccess {
			then(ctx)
		}
	}()
}

func hostOf(ctx *simulator.Context, vm *simulator.VirtualMachine) *simulator.HostSystem {
	if vm.Runtime.Host == nil {
		return nil
	}
	h, _ := ctx.Map.Get(*vm.Runtime.Host).(*simulator.HostSystem)
	return h
}

// vmsOn lists the VMs whose runtime.host is h (vcsim's HostSystem.vm list is not kept up to
// date by RelocateVM_Task, so it is not used).
func vmsOn(ctx *simulator.Context, h *simulator.HostSystem) []*simulator.VirtualMachine {
	var vms []*simulator.VirtualMachine
	for _, obj := range ctx.Map.All("VirtualMachine") {
		if vm, ok := obj.(*simulator.VirtualMachine); ok && vm.Runtime.Host != nil && *vm.Runtime.Host == h.Self {
			vms = append(vms, vm)
		}
	}
	return vms
}

func (e *ext) EnterMaintenanceModeTask(ctx *simulator.Context, req *types.EnterMaintenanceMode_Task) soap.HasFault {
	h, ok := ctx.Map.Get(req.This).(*simulator.HostSystem)
	if !ok {
		return &methods.EnterMaintenanceMode_TaskBody{Fault_: simulator.Fault("", &types.ManagedObjectNotFound{Obj: req.This})}
	}
	post(ctx, &types.EnteringMaintenanceModeEvent{HostEvent: hostEvent(ctx.Map, h)})
	timeout := time.Duration(req.Timeout) * time.Second
	ref := asyncTask(ctx, h, "enterMaintenanceMode", "", func(c *simulator.Context) types.BaseMethodFault {
		start := time.Now()
		for {
			running := 0
			for _, vm := range vmsOn(c, h) {
				if vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn {
					continue
				}
				if isSystemVM(vm) {
					powerOffNow(c, vm)
					continue
				}
				running++
			}
			if running == 0 {
				break
			}
			if timeout > 0 && time.Since(start) > timeout {
				return &types.Timedout{}
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.WithLock(h, func() {
			c.Update(h, []types.PropertyChange{
				{Name: "runtime.inMaintenanceMode", Val: true},
				{Name: "summary.runtime.inMaintenanceMode", Val: true},
			})
		})
		post(c, &types.EnteredMaintenanceModeEvent{HostEvent: hostEvent(c.Map, h)})
		return nil
	})
	return &methods.EnterMaintenanceMode_TaskBody{Res: &types.EnterMaintenanceMode_TaskResponse{Returnval: ref}}
}

// ExitMaintenanceModeTask is stock vcsim's, plus the property update and event it lacks.
func (e *ext) ExitMaintenanceModeTask(ctx *simulator.Context, req *types.ExitMaintenanceMode_Task) soap.HasFault {
	h, ok := ctx.Map.Get(req.This).(*simulator.HostSystem)
	if !ok {
		return &methods.ExitMaintenanceMode_TaskBody{Fault_: simulator.Fault("", &types.ManagedObjectNotFound{Obj: req.This})}
	}
	ref := asyncTask(ctx, h, "exitMaintenanceMode", "", func(c *simulator.Context) types.BaseMethodFault {
		c.WithLock(h, func() {
			c.Update(h, []types.PropertyChange{
				{Name: "runtime.inMaintenanceMode", Val: false},
				{Name: "summary.runtime.inMaintenanceMode", Val: false},
			})
		})
		post(c, &types.ExitMaintenanceModeEvent{HostEvent: hostEvent(c.Map, h)})
		return nil
	})
	return &methods.ExitMaintenanceMode_TaskBody{Res: &types.ExitMaintenanceMode_TaskResponse{Returnval: ref}}
}

func (e *ext) ShutdownHostTask(ctx *simulator.Context, req *types.ShutdownHost_Task) soap.HasFault {
	h, ok := ctx.Map.Get(req.This).(*simulator.HostSystem)
	if !ok {
		return &methods.ShutdownHost_TaskBody{Fault_: simulator.Fault("", &types.ManagedObjectNotFound{Obj: req.This})}
	}
	if h.Runtime.PowerState != types.HostSystemPowerStatePoweredOn {
		return &methods.ShutdownHost_TaskBody{Fault_: simulator.Fault(
			fmt.Sprintf("host %s is not powered on", h.Name), &types.InvalidState{})}
	}
	if !h.Runtime.InMaintenanceMode && !req.Force {
		return &methods.ShutdownHost_TaskBody{Fault_: simulator.Fault(
			fmt.Sprintf("host %s is not in maintenance mode", h.Name), &types.InvalidState{})}
	}
	ref := asyncTask(ctx, h, "shutdownHost", "HostSystem.shutdown", func(c *simulator.Context) types.BaseMethodFault {
		for _, vm := range vmsOn(c, h) {
			powerOffNow(c, vm)
		}
		setHostPower(c, h, false)
		post(c, &types.HostShutdownEvent{HostEvent: hostEvent(c.Map, h), Reason: "upsguard"})
		return nil
	})
	return &methods.ShutdownHost_TaskBody{Res: &types.ShutdownHost_TaskResponse{Returnval: ref}}
}

func setHostPower(ctx *simulator.Context, h *simulator.HostSystem, on bool) {
	power, conn := types.HostSystemPowerStatePoweredOff, types.HostSystemConnectionStateNotResponding
	if on {
		power, conn = types.HostSystemPowerStatePoweredOn, types.HostSystemConnectionStateConnected
	}
	ctx.WithLock(h, func() {
		ctx.Update(h, []types.PropertyChange{
			{Name: "runtime.powerState", Val: power},
			{Name: "runtime.connectionState", Val: conn},
			{Name: "summary.runtime.powerState", Val: power},
			{Name: "summary.runtime.connectionState", Val: conn},
		})
	})
}

// hostPowerOn is the BMC stand-in: after the outage something outside vSphere powers hosts on.
func releaseGuests(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	releaseOnce.Do(func() { close(guestsReleased) })
	fmt.Fprintln(w, "released")
}

func hostPowerOn(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	name := r.URL.Query().Get("name")
	ctx := simulator.SpoofContext()
	for _, obj := range ctx.Map.All("HostSystem") {
		h, ok := obj.(*simulator.HostSystem)
		if !ok || h.Name != name {
			continue
		}
		if h.Runtime.PowerState == types.HostSystemPowerStatePoweredOn {
			fmt.Fprintln(w, "already on")
			return
		}
		go func() {
			time.Sleep(time.Duration(*hostBoot) * time.Millisecond)
			setHostPower(ctx, h, true)
			post(ctx, &types.HostConnectedEvent{HostEvent: hostEvent(ctx.Map, h)})
		}()
		fmt.Fprintln(w, "powering on")
		return
	}
	http.Error(w, "no host named "+name, http.StatusNotFound)
}

// startTools makes VMware Tools run in every powered-on VM, as in a datacenter that has them.
func startTools(ctx *simulator.Context) {
	for _, obj := range ctx.Map.All("VirtualMachine") {
		vm := obj.(*simulator.VirtualMachine)
		if vm.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOn && !isSystemVM(vm) {
			setTools(ctx, vm, true)
		}
	}
}

// addVcls clones the first VM of each cluster as vCLS VMs in a "vCLS" folder, so tests see
// system VMs that must not block host steps.
func addVcls(ctx *simulator.Context, n int) {
	if n <= 0 {
		return
	}
	for _, obj := range ctx.Map.All("ClusterComputeResource") {
		cluster := obj.(*simulator.ClusterComputeResource)
		if len(cluster.Host) == 0 {
			continue
		}
		dc := datacenterOf(ctx.Map, cluster.Self)
		if dc == nil {
			continue
		}
		dcObj := ctx.Map.Get(dc.Datacenter).(*simulator.Datacenter)
		vmFolder := ctx.Map.Get(dcObj.VmFolder).(*simulator.Folder)
		folder := ensureFolder(ctx, vmFolder, "vCLS")
		for i := 0; i < n; i++ {
			host := cluster.Host[i%len(cluster.Host)]
			spec := types.VirtualMachineConfigSpec{
				Name:    fmt.Sprintf("vCLS-%s-%d", cluster.Name, i+1),
				GuestId: string(types.VirtualMachineGuestOsIdentifierOtherGuest),
				Files:   &types.VirtualMachineFileInfo{VmPathName: "[LocalDS_0]"},
				ExtraConfig: []types.BaseOptionValue{
					&types.OptionValue{Key: "HDCS.agent", Value: "true"},
				},
			}
			pool := cluster.ResourcePool
			res := folder.CreateVMTask(ctx, &types.CreateVM_Task{
				This: folder.Self, Config: spec, Pool: *pool, Host: &host,
			})
			task := ctx.Map.Get(res.(*methods.CreateVM_TaskBody).Res.Returnval).(*simulator.Task)
			task.Wait()
			if task.Info.Error != nil {
				log.Fatalf("creating vCLS VM: %v", task.Info.Error.LocalizedMessage)
			}
			vm := ctx.Map.Get(task.Info.Result.(types.ManagedObjectReference)).(*simulator.VirtualMachine)
			on := vm.PowerOnVMTask(ctx, &types.PowerOnVM_Task{This: vm.Self})
			ctx.Map.Get(on.(*methods.PowerOnVM_TaskBody).Res.Returnval).(*simulator.Task).Wait()
		}
	}
}

func ensureFolder(ctx *simulator.Context, parent *simulator.Folder, name string) *simulator.Folder {
	for _, ref := range parent.ChildEntity {
		if f, ok := ctx.Map.Get(ref).(*simulator.Folder); ok && f.Name == name {
			return f
		}
	}
	res := parent.CreateFolder(ctx, &types.CreateFolder{This: parent.Self, Name: name})
	ref := res.(*methods.CreateFolderBody).Res.Returnval
	return ctx.Map.Get(ref).(*simulator.Folder)
}

func parseDelays(spec string) map[string]int {
	m := map[string]int{"LockHandoff": 0}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, value, found := strings.Cut(part, ":")
		ms, err := strconv.Atoi(value)
		if !found || err != nil {
			log.Fatalf("-method-delay: %q is not NAME:MS", part)
		}
		m[name] = ms
	}
	return m
}

func main() {
	model := simulator.VPX()
	flag.IntVar(&model.Datacenter, "dc", model.Datacenter, "Number of datacenters")
	flag.IntVar(&model.Cluster, "cluster", model.Cluster, "Number of clusters")
	flag.IntVar(&model.ClusterHost, "host", model.ClusterHost, "Number of hosts per cluster")
	flag.IntVar(&model.Host, "standalone-host", model.Host, "Number of standalone hosts")
	flag.IntVar(&model.Machine, "vm", model.Machine, "Number of virtual machines per resource pool")
	flag.IntVar(&model.Pool, "pool", model.Pool, "Number of resource pools per compute resource")
	flag.IntVar(&model.Folder, "folder", model.Folder, "Number of folders")
	flag.BoolVar(&model.Autostart, "autostart", model.Autostart, "Autostart model created VMs")
	isESX := flag.Bool("esx", false, "Simulate standalone ESX")
	listen := flag.String("l", "127.0.0.1:8989", "Listen address")
	user := flag.String("username", "", "Login username (any username allowed by default)")
	pass := flag.String("password", "", "Login password (any password allowed by default)")
	certFile := flag.String("tlscert", "", "Path to TLS certificate file")
	keyFile := flag.String("tlskey", "", "Path to TLS key file")
	flag.IntVar(&model.DelayConfig.Delay, "delay", 0, "Method response delay across all methods")
	delays := flag.String("method-delay", "", "Delay per method: 'Name1:ms1,Name2:ms2'")
	flag.Parse()

	m := parseDelays(*delays)
	model.DelayConfig.MethodDelay = m
	simulator.TaskDelay.MethodDelay = m

	u := &url.URL{Host: *listen}
	if *user != "" {
		u.User = url.UserPassword(*user, *pass)
	}
	if *isESX {
		opts := model
		model = simulator.ESX()
		model.Machine = opts.Machine
		model.Autostart = opts.Autostart
		model.DelayConfig = opts.DelayConfig
	}
	model.ServiceContent.About.FullName += " (govmomi simulator, upsguard extension)"
	if err := model.Create(); err != nil {
		log.Fatal(err)
	}

	ctx := simulator.SpoofContext()
	ctx.Map.Handler = route
	ctx.Map.SessionManager().ValidLogin = validLogin(u.User)
	addVcls(ctx, *vclsPerCluster)
	if *toolsDefault {
		startTools(ctx)
	}

	model.Service.RegisterEndpoints = true
	model.Service.Listen = u
	model.Service.TLS = new(tls.Config)
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			log.Fatal(err)
		}
		model.Service.TLS.Certificates = []tls.Certificate{cert}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/upsguard/host-power-on", hostPowerOn)
	mux.HandleFunc("/upsguard/release-guests", releaseGuests)
	model.Service.ServeMux = mux
	server := model.Service.NewServer()
	fmt.Printf("export GOVC_URL=%s GOVC_SIM_PID=%d\n", server.URL, os.Getpid())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	model.Remove()
}
