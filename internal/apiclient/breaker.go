package apiclient

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// AnnotationBreakerFailures lists, comma-separated, the automatic requests
// of a group that ended Failed or SlaExpired: the group's circuit breaker.
const AnnotationBreakerFailures = "lifecycle.x-k8s.io/failed-events"

// BreakerLeaseName is the Lease that carries group's circuit breaker. It
// has no holder (nobody holds a breaker) and never ends in a digit, so it
// is never one of the group's slots (<group>-<i>).
func BreakerLeaseName(group string) string { return group + "-breaker" }

// BreakerFailures returns the failed automatic requests recorded on
// group's breaker; none when the Lease does not exist.
func (c *Client) BreakerFailures(ctx context.Context, group string) ([]string, error) {
	l, err := c.LC.Leases(v1alpha1.SystemNamespace).Get(ctx, BreakerLeaseName(group), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("apiclient: get lease %s: %w", BreakerLeaseName(group), err)
	}
	return breakerList(l), nil
}

func breakerList(l *v1alpha1.LifecycleLease) []string {
	var out []string
	for _, s := range strings.Split(l.Annotations[AnnotationBreakerFailures], ",") {
		if s = strings.TrimSpace(s); s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// RecordBreakerFailure adds event to group's breaker, creating its Lease
// when missing, and returns the failures now recorded. It is idempotent (an
// event already listed is not added again) and safe against the rest of the
// fleet writing at once: updates carry the resourceVersion and retry on a
// conflict. The list only grows (deploy/admission.yaml holds node
// identities to that); an admin resets the breaker by deleting the Lease.
func (c *Client) RecordBreakerFailure(ctx context.Context, group, event string) ([]string, error) {
	leases := c.LC.Leases(v1alpha1.SystemNamespace)
	name := BreakerLeaseName(group)
	var out []string
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			l = &v1alpha1.LifecycleLease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1alpha1.SystemNamespace,
				Annotations: map[string]string{AnnotationBreakerFailures: event}}}
			if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
				if apierrors.IsAlreadyExists(err) { // another node created it: read it again
					return apierrors.NewConflict(v1alpha1.SchemeGroupVersion.WithResource("lifecycleleases").GroupResource(), name, err)
				}
				return err
			}
			out = []string{event}
			return nil
		}
		if err != nil {
			return err
		}
		out = breakerList(l)
		if slices.Contains(out, event) {
			return nil
		}
		out = append(out, event)
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[AnnotationBreakerFailures] = strings.Join(out, ",")
		_, err = leases.Update(ctx, lean(l), metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("apiclient: record failure of %s on lease %s: %w", event, name, err)
	}
	return out, nil
}
