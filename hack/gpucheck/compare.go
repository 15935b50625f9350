package main

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// inventory is the part of `lifecycle-agent gpu inventory --json` compared.
type inventory struct {
	GPUs []struct {
		Index               int    `json:"index"`
		UUID                string `json:"uuid"`
		Name                string `json:"name"`
		PCIBusID            string `json:"pciBusID"`
		MIG                 string `json:"mig"`
		Persistence         string `json:"persistence"`
		RetiredPagesPending string `json:"retiredPagesPending"`
		RemappedRows        *struct {
			Correctable   int  `json:"correctable"`
			Uncorrectable int  `json:"uncorrectable"`
			Pending       bool `json:"pending"`
			Failure       bool `json:"failure"`
		} `json:"remappedRows"`
		ECC *struct {
			Uncorrected uint64 `json:"uncorrected"`
		} `json:"eccVolatile"`
		RecoveryAction string `json:"recoveryAction"`
		Fabric         *struct {
			State string `json:"state"`
		} `json:"fabric"`
		Healthy bool     `json:"healthy"`
		Reasons []string `json:"reasons"`
	} `json:"gpus"`
}

// smiLog is the part of `nvidia-smi -q -x` compared (nvsmi_device_v11/v12
// DTDs; older drivers' names in the *Old fields).
type smiLog struct {
	AttachedGPUs string   `xml:"attached_gpus"`
	GPUs         []smiGPU `xml:"gpu"`
}

type smiGPU struct {
	ID             string `xml:"id,attr"`
	ProductName    string `xml:"product_name"`
	UUID           string `xml:"uuid"`
	Persistence    string `xml:"persistence_mode"`
	MIGCurrent     string `xml:"mig_mode>current_mig"`
	PCIBusID       string `xml:"pci>pci_bus_id"`
	RetiredPending string `xml:"retired_pages>pending_retirement"`
	RetiredOld     string `xml:"retired_pages>pending_blacklist"`
	RemapCorr      string `xml:"remapped_rows>remapped_row_corr"`
	RemapUnc       string `xml:"remapped_rows>remapped_row_unc"`
	RemapPending   string `xml:"remapped_rows>remapped_row_pending"`
	RemapFailure   string `xml:"remapped_rows>remapped_row_failure"`
	ECCVolatile    struct {
		Items []struct {
			XMLName xml.Name
			Text    string `xml:",chardata"`
			Total   string `xml:"total"`
		} `xml:",any"`
	} `xml:"ecc_errors>volatile"`
	FabricState    string `xml:"fabric>state"`
	RecoveryAction string `xml:"gpu_recovery_action"`
}

// Compare prints one line per field and GPU — "ok", "DIFF" (counted) or
// "info" (printed, not counted: a field whose reading may differ by
// driver branch) — and returns the number of differences.
func Compare(invJSON, smiXML []byte, w io.Writer) (int, error) {
	var inv inventory
	if err := json.Unmarshal(invJSON, &inv); err != nil {
		return 0, fmt.Errorf("inventory JSON: %w", err)
	}
	var smi smiLog
	if err := xml.Unmarshal(smiXML, &smi); err != nil {
		return 0, fmt.Errorf("nvidia-smi XML: %w", err)
	}
	diffs := 0
	check := func(hard bool, gpu, field string, agent, ref any) {
		tag := "ok  "
		switch {
		case fmt.Sprint(agent) == fmt.Sprint(ref):
		case hard:
			tag = "DIFF"
			diffs++
		default:
			tag = "info"
		}
		fmt.Fprintf(w, "%s %-16.16s %-26s agent=%v nvidia-smi=%v\n", tag, gpu, field, agent, ref)
	}
	check(true, "-", "GPU count", len(inv.GPUs), len(smi.GPUs))
	if n, err := strconv.Atoi(strings.TrimSpace(smi.AttachedGPUs)); err == nil {
		check(true, "-", "attached_gpus", len(inv.GPUs), n)
	}
	byUUID := map[string]*smiGPU{}
	for i := range smi.GPUs {
		byUUID[strings.TrimSpace(smi.GPUs[i].UUID)] = &smi.GPUs[i]
	}
	for _, g := range inv.GPUs {
		s, ok := byUUID[g.UUID]
		if !ok {
			check(true, g.UUID, "listed by nvidia-smi", true, false)
			continue
		}
		delete(byUUID, g.UUID)
		check(true, g.UUID, "name", g.Name, strings.TrimSpace(s.ProductName))
		pci := s.PCIBusID
		if strings.TrimSpace(pci) == "" {
			pci = s.ID
		}
		check(true, g.UUID, "PCI bus ID", strings.ToLower(g.PCIBusID), strings.ToLower(strings.TrimSpace(pci)))
		check(true, g.UUID, "persistence mode", g.Persistence, tri(s.Persistence))
		check(true, g.UUID, "MIG mode", g.MIG, tri(s.MIGCurrent))
		retired := s.RetiredPending
		if strings.TrimSpace(retired) == "" {
			retired = s.RetiredOld
		}
		check(true, g.UUID, "retired pages pending", g.RetiredPagesPending, tri(retired))
		if r := g.RemappedRows; r != nil {
			check(true, g.UUID, "row remap pending", strconv.FormatBool(r.Pending), tri(s.RemapPending))
			check(true, g.UUID, "row remap failure", strconv.FormatBool(r.Failure), tri(s.RemapFailure))
			check(false, g.UUID, "remapped rows corr/unc", fmt.Sprintf("%d/%d", r.Correctable, r.Uncorrectable), strings.TrimSpace(s.RemapCorr)+"/"+strings.TrimSpace(s.RemapUnc))
		} else {
			check(true, g.UUID, "row remap pending", "unknown", tri(s.RemapPending))
		}
		if g.ECC != nil {
			check(false, g.UUID, "ECC volatile uncorrected", g.ECC.Uncorrected, volatileUncorrected(s))
		} else {
			check(false, g.UUID, "ECC volatile uncorrected", "unknown", volatileUncorrected(s))
		}
		fabric := "NOT_SUPPORTED"
		if g.Fabric != nil {
			fabric = g.Fabric.State
		}
		check(true, g.UUID, "fabric state", fabric, enum(s.FabricState, "NOT_SUPPORTED"))
		if strings.TrimSpace(s.RecoveryAction) == "" {
			// Not reported by this driver: NVML's field 230 is unknown too.
			check(false, g.UUID, "recovery action", g.RecoveryAction, "UNKNOWN")
		} else {
			check(true, g.UUID, "recovery action", g.RecoveryAction, enum(s.RecoveryAction, "UNKNOWN"))
		}
		fmt.Fprintf(w, "     %-16.16s healthy=%v reasons=%v\n", g.UUID, g.Healthy, g.Reasons)
	}
	for u := range byUUID {
		check(true, u, "listed by the agent", false, true)
	}
	return diffs, nil
}

// tri reads nvidia-smi's Enabled/Disabled, Yes/No as the agent's Tri.
func tri(s string) string {
	switch strings.TrimSpace(s) {
	case "Enabled", "Yes":
		return "true"
	case "Disabled", "No":
		return "false"
	}
	return "unknown"
}

// enum reads "Drain and Reset" as DRAIN_AND_RESET; N/A (or nothing) is na.
func enum(s, na string) string {
	s = strings.TrimSpace(s)
	if s == "" || s == "N/A" {
		return na
	}
	return strings.ToUpper(strings.ReplaceAll(s, " ", "_"))
}

// volatileUncorrected sums the volatile uncorrectable ECC counters: the
// total of double_bit (older drivers) or the sram_ and dram_uncorrectable
// counters (their _parity/_secded parts are a breakdown, not added).
func volatileUncorrected(s *smiGPU) string {
	var sum uint64
	seen := false
	for _, it := range s.ECCVolatile.Items {
		v := strings.TrimSpace(it.Text)
		switch it.XMLName.Local {
		case "double_bit":
			v = strings.TrimSpace(it.Total)
		case "sram_uncorrectable", "dram_uncorrectable":
		default:
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return "unknown"
		}
		sum, seen = sum+n, true
	}
	if !seen {
		return "unknown"
	}
	return strconv.FormatUint(sum, 10)
}
