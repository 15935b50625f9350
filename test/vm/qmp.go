package vm

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"time"
)

// QMP sends one command (no arguments) to the VM's QEMU monitor socket and
// returns its "return" value. Asynchronous events on the way are skipped.
func (v *VM) QMP(command string) (json.RawMessage, error) {
	conn, err := net.DialTimeout("unix", filepath.Join(v.Dir, "qmp.sock"), 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("vm: qmp: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	r := bufio.NewReader(conn)
	type reply struct {
		QMP    json.RawMessage `json:"QMP"`
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
		Event string `json:"event"`
	}
	read := func() (reply, error) {
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return reply{}, err
			}
			var m reply
			if err := json.Unmarshal(line, &m); err != nil {
				return reply{}, fmt.Errorf("bad QMP line %q: %w", line, err)
			}
			if m.Event != "" {
				continue
			}
			return m, nil
		}
	}
	exec := func(cmd string) (json.RawMessage, error) {
		if _, err := fmt.Fprintf(conn, `{"execute":%q}`+"\n", cmd); err != nil {
			return nil, err
		}
		m, err := read()
		if err != nil {
			return nil, err
		}
		if m.Error != nil {
			return nil, fmt.Errorf("%s: %s", m.Error.Class, m.Error.Desc)
		}
		return m.Return, nil
	}
	if _, err := read(); err != nil { // greeting
		return nil, fmt.Errorf("vm: qmp greeting: %w", err)
	}
	if _, err := exec("qmp_capabilities"); err != nil {
		return nil, fmt.Errorf("vm: qmp_capabilities: %w", err)
	}
	ret, err := exec(command)
	if err != nil && command == "quit" {
		return nil, nil // QEMU may close the socket before it answers
	}
	if err != nil {
		return nil, fmt.Errorf("vm: qmp %s: %w", command, err)
	}
	return ret, nil
}
