// pod-security-check evaluates every pod template in Kubernetes manifests against a Pod
// Security Standards level with the checks the API server's PodSecurity admission runs
// (k8s.io/pod-security-admission/policy), offline. Exit status 1 when any pod template
// fails, 2 on a file it cannot read or decode.
//
//	pod-security-check [-level restricted] [-version latest] FILE...
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"
)

type podTemplate struct {
	what string
	meta *metav1.ObjectMeta
	spec *corev1.PodSpec
}

func main() {
	level := flag.String("level", "restricted", "privileged, baseline or restricted")
	version := flag.String("version", "latest", "policy version, e.g. v1.30 or latest")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: pod-security-check [-level restricted] [-version latest] FILE...")
		os.Exit(2)
	}
	lv, err := api.ParseLevel(*level)
	if err != nil {
		fail(err)
	}
	ver, err := api.ParseVersion(*version)
	if err != nil {
		fail(err)
	}
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks())
	if err != nil {
		fail(err)
	}
	failed, checked := 0, 0
	for _, file := range flag.Args() {
		templates, err := read(file)
		if err != nil {
			fail(fmt.Errorf("%s: %w", file, err))
		}
		for _, t := range templates {
			checked++
			results := evaluator.EvaluatePod(api.LevelVersion{Level: lv, Version: ver}, t.meta, t.spec)
			for _, r := range results {
				if !r.Allowed {
					failed++
					fmt.Printf("%s: %s: %s: %s (%s)\n", file, t.what, r.ForbiddenReason, r.ForbiddenDetail, *level)
				}
			}
		}
	}
	if checked == 0 {
		fail(errors.New("no pod template found in the files"))
	}
	if failed > 0 {
		os.Exit(1)
	}
	fmt.Printf("%d pod template(s) meet Pod Security %q (%s)\n", checked, *level, *version)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "pod-security-check:", err)
	os.Exit(2)
}

// read returns the pod templates of every document in file that has one.
func read(file string) ([]podTemplate, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []podTemplate
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(strings.TrimSpace(string(doc))) == 0 {
			continue
		}
		var head metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, err
		}
		t, err := template(head.Kind, doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", head.Kind, err)
		}
		if t != nil {
			out = append(out, *t)
		}
	}
}

func template(kind string, doc []byte) (*podTemplate, error) {
	decode := func(into any) error { return yaml.UnmarshalStrict(doc, into) }
	switch kind {
	case "Pod":
		var o corev1.Pod
		if err := decode(&o); err != nil {
			return nil, err
		}
		return &podTemplate{"Pod/" + o.Name, &o.ObjectMeta, &o.Spec}, nil
	case "Deployment":
		var o appsv1.Deployment
		if err := decode(&o); err != nil {
			return nil, err
		}
		return &podTemplate{"Deployment/" + o.Name, &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec}, nil
	case "StatefulSet":
		var o appsv1.StatefulSet
		if err := decode(&o); err != nil {
			return nil, err
		}
		return &podTemplate{"StatefulSet/" + o.Name, &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec}, nil
	case "DaemonSet":
		var o appsv1.DaemonSet
		if err := decode(&o); err != nil {
			return nil, err
		}
		return &podTemplate{"DaemonSet/" + o.Name, &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec}, nil
	case "Job":
		var o batchv1.Job
		if err := decode(&o); err != nil {
			return nil, err
		}
		return &podTemplate{"Job/" + o.Name, &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec}, nil
	case "CronJob":
		var o batchv1.CronJob
		if err := decode(&o); err != nil {
			return nil, err
		}
		return &podTemplate{"CronJob/" + o.Name, &o.Spec.JobTemplate.Spec.Template.ObjectMeta, &o.Spec.JobTemplate.Spec.Template.Spec}, nil
	}
	return nil, nil
}
