// Command kube-testbins is a multi-call binary (hyperkube style) holding the
// parts of a real Kubernetes control plane that Scale Agent's tests and demo
// run: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
// kubectl, the node components of the real-node tests, kubelet and
// kube-proxy, and metrics-server (the aggregated metrics.k8s.io API that
// `kubectl top` reads, scraping the real node's kubelet). Linking them into one binary compiles and links the shared
// Kubernetes dependencies once, which roughly halves the cold build on a
// 2-core machine.
//
// One more command is a test client, not a component: watchlist-informer, a
// client-go informer in WatchList mode (see watchListInformer).
//
// The component is chosen by the name the binary is invoked under (build.sh
// creates one symlink per component), or by the first argument:
//
//	kube-apiserver --etcd-servers=...
//	kube-testbins kube-apiserver --etcd-servers=...
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	_ "time/tzdata"

	"github.com/spf13/cobra"

	"go.etcd.io/etcd/server/v3/etcdmain"
	corev1 "k8s.io/api/core/v1"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientversion "k8s.io/client-go/pkg/version"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/klog/v2"
	openapicommon "k8s.io/kube-openapi/pkg/common"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	metricsserver "sigs.k8s.io/metrics-server/cmd/metrics-server/app/options"
)

var components = map[string]func() int{
	"etcd": func() int {
		etcdmain.Main(os.Args)
		return 0
	},
	"kube-apiserver": func() int {
		return cli.Run(apiserver.NewAPIServerCommand())
	},
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int {
		return cli.Run(scheduler.NewSchedulerCommand())
	},
	"kubelet": func() int {
		// NewKubeletCommand takes the context its servers run under since 1.37; a nil
		// one panics at start. The kubelet handles SIGTERM itself.
		return cli.Run(kubelet.NewKubeletCommand(context.Background()))
	},
	"kube-proxy": func() int {
		return cli.Run(proxy.NewProxyCommand())
	},
	"metrics-server": func() int {
		return cli.Run(metricsServerCommand())
	},
	"watchlist-informer": watchListInformer,
	"kubectl": func() int {
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	},
}

// metricsServerCommand is metrics-server's own command (its options, flags and server, as
// its cmd/metrics-server/app builds them) with one change: its OpenAPI definitions,
// generated against the Kubernetes 1.33 libraries and keyed by Go type name
// ("k8s.io/metrics/pkg/apis/metrics/v1beta1.NodeMetrics"), are also offered under the
// model names the libraries of this release look them up by
// ("io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetrics", the types' OpenAPIModelName).
// Without it metrics-server exits at start: "cannot find model definition for
// io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetrics".
func metricsServerCommand() *cobra.Command {
	opts := metricsserver.NewOptions()
	cmd := &cobra.Command{
		Use:   "metrics-server",
		Short: "Launch metrics-server",
		RunE: func(*cobra.Command, []string) error {
			if opts.ShowVersion {
				fmt.Println(clientversion.Get().GitVersion)
				return nil
			}
			if errs := opts.Validate(); len(errs) > 0 {
				return errs[0]
			}
			config, err := opts.ServerConfig()
			if err != nil {
				return err
			}
			// The v3 configuration also holds the definitions already made (Definitions),
			// which take precedence over GetDefinitions.
			v2, v3 := config.Apiserver.OpenAPIConfig, config.Apiserver.OpenAPIV3Config
			v2.GetDefinitions, v2.Definitions = withModelNames(v2.GetDefinitions), addModelNames(v2.Definitions)
			v3.GetDefinitions, v3.Definitions = withModelNames(v3.GetDefinitions), addModelNames(v3.Definitions)
			server, err := config.Complete()
			if err != nil {
				return err
			}
			// Stops on SIGTERM (the handler can be set up once per process).
			return server.RunUntil(genericapiserver.SetupSignalHandler())
		},
	}
	for _, set := range opts.Flags().FlagSets {
		cmd.Flags().AddFlagSet(set)
	}
	goFlags := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	logs.AddGoFlags(goFlags)
	cmd.Flags().AddGoFlagSet(goFlags)
	return cmd
}

// withModelNames offers every definition also under its model name (see addModelNames).
func withModelNames(definitions openapicommon.GetOpenAPIDefinitions) openapicommon.GetOpenAPIDefinitions {
	return func(ref openapicommon.ReferenceCallback) map[string]openapicommon.OpenAPIDefinition {
		return addModelNames(definitions(ref))
	}
}

// addModelNames returns the definitions keyed by Go type name and also by REST-friendly
// model name: the Go package path's host reversed, and dots for slashes (as apimachinery's
// toOpenAPIDefinitionName does).
func addModelNames(byGoName map[string]openapicommon.OpenAPIDefinition) map[string]openapicommon.OpenAPIDefinition {
	if byGoName == nil {
		return nil
	}
	all := make(map[string]openapicommon.OpenAPIDefinition, 2*len(byGoName))
	for name, definition := range byGoName {
		all[name] = definition
		parts := strings.Split(name, "/")
		if host := strings.Split(parts[0], "."); len(host) > 1 {
			for i, j := 0, len(host)-1; i < j; i, j = i+1, j-1 {
				host[i], host[j] = host[j], host[i]
			}
			parts[0] = strings.Join(host, ".")
		}
		all[strings.Join(parts, ".")] = definition
	}
	return all
}

// watchListInformer runs a client-go informer of the ConfigMaps of one namespace
// in WatchList mode (client-go's default since v0.35, forced here with its
// feature gate): its first request is a streaming list
// (watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan), and it
// reports synced only once the bookmark annotated k8s.io/initial-events-end has
// come. It prints one line per fact on stdout:
//
//	SYNCED a,b,c        the informer synced, with the names in its store
//	ADDED d             an event after the sync (UPDATED, DELETED likewise)
//
// and exits after --seconds. With -v=6 client-go logs each request on stderr.
//
//	kube-testbins watchlist-informer --kubeconfig=PATH --namespace=NS [--seconds=60] [--protobuf] [-v=6]
func watchListInformer() int {
	flags := flag.NewFlagSet("watchlist-informer", flag.ExitOnError)
	kubeconfig := flags.String("kubeconfig", "", "the kubeconfig to use")
	namespace := flags.String("namespace", "", "the namespace whose ConfigMaps to watch")
	seconds := flags.Int("seconds", 60, "how long to run")
	protobuf := flags.Bool("protobuf", false, "ask for protobuf, the typed clientset's default, instead of JSON")
	klog.InitFlags(flags)
	_ = flags.Parse(os.Args[1:])
	// client-go reads its feature gates from the environment on first use.
	os.Setenv("KUBE_FEATURE_WatchListClient", "true")
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "watchlist-informer: %v\n", err)
		return 1
	}
	if !*protobuf {
		// What dynamic clients and controller-runtime's ask for (and what the hub's
		// cache answers; protobuf is passed to the API server).
		config.ContentType = "application/json"
		config.AcceptContentTypes = "application/json"
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "watchlist-informer: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*seconds)*time.Second)
	defer cancel()
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(*namespace))
	informer := factory.Core().V1().ConfigMaps().Informer()
	synced := make(chan struct{})
	report := func(what string, obj interface{}) {
		select {
		case <-synced:
		default:
			return
		}
		if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tombstone.Obj
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			fmt.Printf("%s %s\n", what, cm.Name)
		}
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { report("ADDED", obj) },
		UpdateFunc: func(_, obj interface{}) { report("UPDATED", obj) },
		DeleteFunc: func(obj interface{}) { report("DELETED", obj) },
	})
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		fmt.Fprintln(os.Stderr, "watchlist-informer: the informer never synced")
		return 1
	}
	names := informer.GetStore().ListKeys()
	for i, key := range names {
		names[i] = key[strings.LastIndex(key, "/")+1:]
	}
	sort.Strings(names)
	fmt.Printf("SYNCED %s\n", strings.Join(names, ","))
	close(synced)
	<-ctx.Done()
	factory.Shutdown()
	return 0
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok && len(os.Args) > 1 {
		// Invoked as `kube-testbins <component> args...`: shift the component
		// name into argv[0] so each command parses its own flags as usual.
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	run, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "kube-testbins: unknown component %q; invoke as one of %v\n", name, names)
		os.Exit(2)
	}
	os.Exit(run())
}
