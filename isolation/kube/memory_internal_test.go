package kube

import "testing"

// The working set is read from what cat printed of whichever cgroup
// version the container has, as the kubelet computes it.
func TestKubernetesWorkingSetOfTheCgroupFiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		out  string
		want int64
		ok   bool
	}{
		{"cgroup_v2_is_current_less_inactive_file", "8388608\nanon 4194304\nfile 4194304\nactive_file 1048576\ninactive_file 3145728\n", 5242880, true},
		{"cgroup_v1_takes_the_hierarchys_total_inactive_file", "1220608\ncache 0\ninactive_file 4096\ntotal_inactive_file 8192\n", 1212416, true},
		{"more_inactive_than_usage_is_zero", "4096\ninactive_file 8192\n", 0, true},
		{"no_usage_is_no_answer", "anon 4096\ninactive_file 0\n", 0, false},
		{"nothing_printed_is_no_answer", "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, ok := workingSet([]byte(tc.out))
			if got != tc.want || ok != tc.ok {
				t.Errorf("workingSet = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
