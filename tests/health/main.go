// health: how Flux, kpt and Argo CD judge an object's health, for tests that
// hold drover's DroverStatus to them (tests/agent/agent_conditions.rs).
//
//	health kstatus < object.json         kstatus's Compute, as Flux's health
//	                                     checks and kpt call it
//	health argocd SCRIPT < object.json   a health.lua resource customization,
//	                                     run as Argo CD runs one
//
// Each prints one JSON object, {"status": ..., "message": ...}, and exits 0;
// an object or script it cannot judge exits 1 with the reason on stderr.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: health kstatus|argocd [SCRIPT] < object.json"))
	}
	raw, err := io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	if err != nil {
		fail(err)
	}
	var obj map[string]interface{}
	if err := json.Unmarshal(raw, &obj); err != nil {
		fail(fmt.Errorf("the object is not JSON: %w", err))
	}
	var v verdict
	switch os.Args[1] {
	case "kstatus":
		v, err = kstatus(obj)
	case "argocd":
		if len(os.Args) != 3 {
			fail(fmt.Errorf("usage: health argocd SCRIPT < object.json"))
		}
		v, err = argocd(obj, os.Args[2])
	default:
		err = fmt.Errorf("unknown judge %q: kstatus or argocd", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
	out, _ := json.Marshal(v)
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "health:", err)
	os.Exit(1)
}

// kstatus computes the status the way Flux's kustomize-controller does for
// a healthChecks entry (sigs.k8s.io/cli-utils status.Compute).
func kstatus(obj map[string]interface{}) (verdict, error) {
	// Through JSON again, so integers are int64 as the API machinery's
	// decoder gives them (generation against observedGeneration).
	u := &unstructured.Unstructured{}
	raw, _ := json.Marshal(obj)
	if err := u.UnmarshalJSON(raw); err != nil {
		return verdict{}, err
	}
	res, err := status.Compute(u)
	if err != nil {
		return verdict{}, err
	}
	return verdict{Status: res.Status.String(), Message: res.Message}, nil
}

// argocd runs a health.lua the way Argo CD runs a resource customization
// from argocd-cm: gopher-lua without the standard libraries except package,
// base and table, a one-second limit, the object as the global `obj`, and
// the returned table's `status` one of Argo CD's health codes.
func argocd(obj map[string]interface{}, scriptPath string) (verdict, error) {
	script, err := os.ReadFile(scriptPath)
	if err != nil {
		return verdict{}, err
	}
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for name, open := range map[string]lua.LGFunction{
		lua.LoadLibName: lua.OpenPackage,
		lua.BaseLibName: lua.OpenBase,
		lua.TabLibName:  lua.OpenTable,
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(open), Protect: true}, lua.LString(name)); err != nil {
			return verdict{}, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(string(script)); err != nil {
		return verdict{}, err
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return verdict{}, fmt.Errorf("the script returned %s, not a table", l.Get(-1).Type())
	}
	v := verdict{
		Status:  lua.LVAsString(ret.RawGetString("status")),
		Message: lua.LVAsString(ret.RawGetString("message")),
	}
	switch v.Status {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown":
		return v, nil
	}
	// What Argo CD makes of a status it does not know.
	return verdict{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
}

// toLua turns decoded JSON into Lua values: objects into tables keyed by
// name, arrays into sequences from 1, numbers, strings, booleans, nil.
func toLua(l *lua.LState, v interface{}) lua.LValue {
	switch x := v.(type) {
	case map[string]interface{}:
		t := l.CreateTable(0, len(x))
		for k, e := range x {
			t.RawSetString(k, toLua(l, e))
		}
		return t
	case []interface{}:
		t := l.CreateTable(len(x), 0)
		for _, e := range x {
			t.Append(toLua(l, e))
		}
		return t
	case string:
		return lua.LString(x)
	case float64:
		return lua.LNumber(x)
	case bool:
		return lua.LBool(x)
	}
	return lua.LNil
}
