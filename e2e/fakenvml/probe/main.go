// Command probe drives an NVML library through github.com/NVIDIA/go-nvml the way a Go device plugin does (the
// NVIDIA k8s-device-plugin's inventory and its health check): init, count, handles, UUID, name, memory, minor
// number, PCI bus id, then an event set registered for the supported health events, waited on once. It prints
// one line per step, "step key=value ...", so a test can follow it and inject an event while it waits.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func main() {
	waitMs := flag.Uint("wait-ms", 0, "how long the event-set wait lasts, in milliseconds")
	flag.Parse()
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		fmt.Printf("init ret=%d error=%q\n", int(ret), nvml.ErrorString(ret))
		os.Exit(1)
	}
	driver, ret := lib.SystemGetDriverVersion()
	fmt.Printf("driver ret=%d version=%s\n", int(ret), driver)
	count, ret := lib.DeviceGetCount()
	fmt.Printf("count ret=%d count=%d\n", int(ret), count)
	set, ret := lib.EventSetCreate()
	fmt.Printf("eventset ret=%d\n", int(ret))
	for i := 0; i < count; i++ {
		device, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			fmt.Printf("handle index=%d ret=%d\n", i, int(ret))
			continue
		}
		uuid, _ := device.GetUUID()
		name, _ := device.GetName()
		memory, memRet := device.GetMemoryInfo()
		minor, minorRet := device.GetMinorNumber()
		pci, pciRet := device.GetPciInfo()
		busID := ""
		if pciRet == nvml.SUCCESS {
			busID = pciBusID(pci.BusId)
		}
		fmt.Printf("device index=%d uuid=%s name=%q memory_ret=%d total=%d minor_ret=%d minor=%d pci_ret=%d bus=%s\n",
			i, uuid, name, int(memRet), memory.Total, int(minorRet), minor, int(pciRet), busID)
		supported, ret := device.GetSupportedEventTypes()
		wanted := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError)
		ret = device.RegisterEvents(wanted&supported, set)
		fmt.Printf("register index=%d ret=%d\n", i, int(ret))
	}
	_, ret = lib.DeviceGetHandleByIndex(count)
	fmt.Printf("bad-index ret=%d error=%q\n", int(ret), nvml.ErrorString(ret))
	fmt.Printf("waiting ms=%d\n", *waitMs)
	event, ret := set.Wait(uint32(*waitMs))
	if ret == nvml.SUCCESS {
		uuid, _ := event.Device.GetUUID()
		fmt.Printf("event ret=0 uuid=%s type=%d xid=%d gi=%d\n", uuid, event.EventType, event.EventData, event.GpuInstanceId)
	} else {
		fmt.Printf("event ret=%d error=%q\n", int(ret), nvml.ErrorString(ret))
	}
	fmt.Printf("free ret=%d\n", int(set.Free()))
	fmt.Printf("shutdown ret=%d\n", int(lib.Shutdown()))
	fmt.Printf("shutdown-again ret=%d\n", int(lib.Shutdown()))
}

func pciBusID(raw [32]int8) string {
	out := make([]byte, 0, len(raw))
	for _, c := range raw {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
