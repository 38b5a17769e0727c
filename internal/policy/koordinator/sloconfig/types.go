package sloconfig

// The strategy types of Koordinator's slo-controller-config, ported field
// for field (names, Go types, JSON names and `validate` tags) from
// koordinator-sh/koordinator v1.8.0:
//
//   - apis/configuration/slo_controller_config.go:40-118 (NodeCfgProfile,
//     ColocationCfg, ResourceThresholdCfg, CPUBurstCfg, SystemCfg,
//     ResourceQOSCfg and their node strategies) and :239-283
//     (ColocationStrategy);
//   - apis/slo/v1alpha1/nodeslo_types.go:29-477 (CPUQOS, MemoryQOS,
//     IOCfg, BlockCfg, ResourceQOS, NetworkQOS, ResourceQOSStrategy,
//     ResourceThresholdStrategy, ResctrlQOS, CPUBurstConfig,
//     CPUBurstStrategy, SystemStrategy);
//   - apis/slo/v1alpha1/nodemetric_types.go:29,96 (NodeMemoryCollectPolicy,
//     AggregatePolicy).
//
// Upstream decodes each key with encoding/json (case-insensitive names,
// unknown fields ignored, a wrong type an error) and validates the result
// with github.com/go-playground/validator/v10 (v10.11.2, upstream's go.mod)
// and its English translations; kadmit does the same with the same library,
// so the rules and the messages (which name Go struct fields, e.g.
// "ResourceThresholdCfg.ClusterStrategy.CPUSuppressThresholdPercent") are
// upstream's. Types and field names therefore must not be renamed.
//
// One deliberate change: quantities an object controls
// (SystemStrategy.TotalNetworkBandwidth) decode through internal/quantity,
// so a spelling like "1e9999999" is refused before any big-number
// arithmetic (upstream: resource.Quantity, unbounded cost).

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kadmit/kadmit/internal/quantity"
)

// The slo-controller-config data keys (apis/configuration/
// slo_controller_config.go:29-33).
const (
	ColocationConfigKey        = "colocation-config"
	ResourceThresholdConfigKey = "resource-threshold-config"
	ResourceQOSConfigKey       = "resource-qos-config"
	CPUBurstConfigKey          = "cpu-burst-config"
	SystemConfigKey            = "system-config"
)

// NodeCfgProfile names a node strategy and selects its nodes.
type NodeCfgProfile struct {
	Name         string                `json:"name,omitempty"`
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
}

// ColocationCfg is data["colocation-config"].
type ColocationCfg struct {
	ColocationStrategy `json:",inline"`
	NodeConfigs        []NodeColocationCfg `json:"nodeConfigs,omitempty" validate:"dive"`
}

// NodeColocationCfg is one node strategy of ColocationCfg.
type NodeColocationCfg struct {
	NodeCfgProfile `json:",inline"`
	ColocationStrategy
}

// ResourceThresholdCfg is data["resource-threshold-config"].
type ResourceThresholdCfg struct {
	ClusterStrategy *ResourceThresholdStrategy      `json:"clusterStrategy,omitempty"`
	NodeStrategies  []NodeResourceThresholdStrategy `json:"nodeStrategies,omitempty" validate:"dive"`
}

// NodeResourceThresholdStrategy is one node strategy of ResourceThresholdCfg.
type NodeResourceThresholdStrategy struct {
	NodeCfgProfile `json:",inline"`
	*ResourceThresholdStrategy
}

// NodeCPUBurstCfg is one node strategy of CPUBurstCfg.
type NodeCPUBurstCfg struct {
	NodeCfgProfile `json:",inline"`
	*CPUBurstStrategy
}

// CPUBurstCfg is data["cpu-burst-config"].
type CPUBurstCfg struct {
	ClusterStrategy *CPUBurstStrategy `json:"clusterStrategy,omitempty"`
	NodeStrategies  []NodeCPUBurstCfg `json:"nodeStrategies,omitempty" validate:"dive"`
}

// NodeSystemStrategy is one node strategy of SystemCfg.
type NodeSystemStrategy struct {
	NodeCfgProfile `json:",inline"`
	*SystemStrategy
}

// SystemCfg is data["system-config"].
type SystemCfg struct {
	ClusterStrategy *SystemStrategy      `json:"clusterStrategy,omitempty"`
	NodeStrategies  []NodeSystemStrategy `json:"nodeStrategies,omitempty" validate:"dive"`
}

// ResourceQOSCfg is data["resource-qos-config"].
type ResourceQOSCfg struct {
	ClusterStrategy *ResourceQOSStrategy      `json:"clusterStrategy,omitempty"`
	NodeStrategies  []NodeResourceQOSStrategy `json:"nodeStrategies,omitempty" validate:"dive"`
}

// NodeResourceQOSStrategy is one node strategy of ResourceQOSCfg.
type NodeResourceQOSStrategy struct {
	NodeCfgProfile `json:",inline"`
	*ResourceQOSStrategy
}

// CalculatePolicy is how the colocation controller computes reclaimable resources.
type CalculatePolicy string

// MidReclaimMode is the mid-tier reclaim mode.
type MidReclaimMode string

// ColocationStrategyExtender holds third-party colocation fields.
type ColocationStrategyExtender struct {
	Extensions ExtraFields `json:"extensions,omitempty"`
}

// ExtraFields is any JSON object.
type ExtraFields map[string]interface{}

// NodeMemoryCollectPolicy is how koordlet counts node memory.
type NodeMemoryCollectPolicy string

// AggregatePolicy lists the metric aggregation windows.
type AggregatePolicy struct {
	Durations []metav1.Duration `json:"durations,omitempty"`
}

// ColocationStrategy is the colocation strategy (cluster-wide or per node).
type ColocationStrategy struct {
	Enable                         *bool                    `json:"enable,omitempty"`
	MetricAggregateDurationSeconds *int64                   `json:"metricAggregateDurationSeconds,omitempty" validate:"omitempty,min=1"`
	MetricReportIntervalSeconds    *int64                   `json:"metricReportIntervalSeconds,omitempty" validate:"omitempty,min=1"`
	MetricAggregatePolicy          *AggregatePolicy         `json:"metricAggregatePolicy,omitempty"`
	MetricMemoryCollectPolicy      *NodeMemoryCollectPolicy `json:"metricMemoryCollectPolicy,omitempty"`

	CPUReclaimThresholdPercent    *int64           `json:"cpuReclaimThresholdPercent,omitempty" validate:"omitempty,min=0"`
	CPUCalculatePolicy            *CalculatePolicy `json:"cpuCalculatePolicy,omitempty"`
	MemoryReclaimThresholdPercent *int64           `json:"memoryReclaimThresholdPercent,omitempty" validate:"omitempty,min=0"`
	MemoryCalculatePolicy         *CalculatePolicy `json:"memoryCalculatePolicy,omitempty"`
	DegradeTimeMinutes            *int64           `json:"degradeTimeMinutes,omitempty" validate:"omitempty,min=1"`
	UpdateTimeThresholdSeconds    *int64           `json:"updateTimeThresholdSeconds,omitempty" validate:"omitempty,min=1"`
	ResourceDiffThreshold         *float64         `json:"resourceDiffThreshold,omitempty" validate:"omitempty,gt=0,max=1"`

	MidReclaimMode                 *MidReclaimMode `json:"midReclaimMode,omitempty" validate:"omitempty"`
	MidCPUThresholdPercent         *int64          `json:"midCPUThresholdPercent,omitempty" validate:"omitempty,min=0,max=100"`
	MidMemoryThresholdPercent      *int64          `json:"midMemoryThresholdPercent,omitempty" validate:"omitempty,min=0,max=100"`
	MidUnallocatedPercent          *int64          `json:"midUnallocatedPercent,omitempty" validate:"omitempty,min=0,max=100"`
	MidStaticCPUReservedPercent    *int64          `json:"midStaticCPUReservedPercent,omitempty" validate:"omitempty,min=0,max=100"`
	MidStaticMemoryReservedPercent *int64          `json:"midStaticMemoryReservedPercent,omitempty" validate:"omitempty,min=0,max=100"`

	BatchCPUThresholdPercent    *int64 `json:"batchCPUThresholdPercent,omitempty" validate:"omitempty,min=0"`
	BatchMemoryThresholdPercent *int64 `json:"batchMemoryThresholdPercent,omitempty" validate:"omitempty,min=0"`

	ColocationStrategyExtender `json:",inline"`
}

// CPUQOS is the CPU QoS of a class.
type CPUQOS struct {
	GroupIdentity *int64 `json:"groupIdentity,omitempty" validate:"omitempty,min=-1,max=2"`
	SchedIdle     *int64 `json:"schedIdle,omitempty" validate:"omitempty,min=0,max=1"`
	CoreExpeller  *bool  `json:"coreExpeller,omitempty"`
}

// CPUQOSPolicy is the cluster's CPU QoS mechanism.
type CPUQOSPolicy string

// NETQOSPolicy is the cluster's network QoS mechanism.
type NETQOSPolicy string

// MemoryQOS is the memory QoS of a class.
type MemoryQOS struct {
	MinLimitPercent   *int64 `json:"minLimitPercent,omitempty" validate:"omitempty,min=0,max=100"`
	LowLimitPercent   *int64 `json:"lowLimitPercent,omitempty" validate:"omitempty,min=0,max=100"`
	ThrottlingPercent *int64 `json:"throttlingPercent,omitempty" validate:"omitempty,min=0,max=100"`
	WmarkRatio        *int64 `json:"wmarkRatio,omitempty" validate:"omitempty,min=0,max=100"`
	WmarkScalePermill *int64 `json:"wmarkScalePermill,omitempty" validate:"omitempty,min=1,max=1000"`
	WmarkMinAdj       *int64 `json:"wmarkMinAdj,omitempty" validate:"omitempty,min=-25,max=50"`
	PriorityEnable    *int64 `json:"priorityEnable,omitempty" validate:"omitempty,min=0,max=1"`
	Priority          *int64 `json:"priority,omitempty" validate:"omitempty,min=0,max=12"`
	OomKillGroup      *int64 `json:"oomKillGroup,omitempty" validate:"omitempty,min=0,max=1"`
}

// CPUQOSCfg is CPUQOS with its switch.
type CPUQOSCfg struct {
	Enable *bool `json:"enable,omitempty"`
	CPUQOS `json:",inline"`
}

// MemoryQOSCfg is MemoryQOS with its switch.
type MemoryQOSCfg struct {
	Enable    *bool `json:"enable,omitempty"`
	MemoryQOS `json:",inline"`
}

// BlockType is a block device kind.
type BlockType string

// IOCfg is one block device's IO limits.
type IOCfg struct {
	ReadIOPS            *int64 `json:"readIOPS,omitempty"`
	WriteIOPS           *int64 `json:"writeIOPS,omitempty"`
	ReadBPS             *int64 `json:"readBPS,omitempty"`
	WriteBPS            *int64 `json:"writeBPS,omitempty"`
	IOWeightPercent     *int64 `json:"ioWeightPercent,omitempty"`
	ReadLatency         *int64 `json:"readLatency,omitempty"`
	WriteLatency        *int64 `json:"writeLatency,omitempty"`
	ReadLatencyPercent  *int64 `json:"readLatencyPercent,omitempty"`
	WriteLatencyPercent *int64 `json:"writeLatencyPercent,omitempty"`
	EnableUserModel     *bool  `json:"enableUserModel,omitempty"`
	ModelReadBPS        *int64 `json:"modelReadBPS,omitempty"`
	ModelWriteBPS       *int64 `json:"modelWriteBPS,omitempty"`
	ModelReadSeqIOPS    *int64 `json:"modelReadSeqIOPS,omitempty"`
	ModelWriteSeqIOPS   *int64 `json:"modelWriteSeqIOPS,omitempty"`
	ModelReadRandIOPS   *int64 `json:"modelReadRandIOPS,omitempty"`
	ModelWriteRandIOPS  *int64 `json:"modelWriteRandIOPS,omitempty"`
}

// BlockCfg is one block device.
type BlockCfg struct {
	Name      string    `json:"name,omitempty"`
	BlockType BlockType `json:"type,omitempty"`
	IOCfg     IOCfg     `json:"ioCfg,omitempty"`
}

// BlkIOQOS lists block devices.
type BlkIOQOS struct {
	Blocks []*BlockCfg `json:"blocks,omitempty"`
}

// BlkIOQOSCfg is BlkIOQOS with its switch.
type BlkIOQOSCfg struct {
	Enable   *bool `json:"enable,omitempty"`
	BlkIOQOS `json:",inline"`
}

// ResourceQOS is the QoS of one class.
type ResourceQOS struct {
	CPUQOS     *CPUQOSCfg     `json:"cpuQOS,omitempty"`
	MemoryQOS  *MemoryQOSCfg  `json:"memoryQOS,omitempty"`
	BlkIOQOS   *BlkIOQOSCfg   `json:"blkioQOS,omitempty"`
	ResctrlQOS *ResctrlQOSCfg `json:"resctrlQOS,omitempty"`
	NetworkQOS *NetworkQOSCfg `json:"networkQOS,omitempty"`
}

// NetworkQOSCfg is NetworkQOS with its switch.
type NetworkQOSCfg struct {
	Enable     *bool `json:"enable,omitempty"`
	NetworkQOS `json:",inline"`
}

// NetworkQOS is a class's bandwidth: an integer percentage (0-100) or a
// quantity string ("50M") each.
type NetworkQOS struct {
	IngressRequest *intstr.IntOrString `json:"ingressRequest,omitempty"`
	IngressLimit   *intstr.IntOrString `json:"ingressLimit,omitempty"`
	EgressRequest  *intstr.IntOrString `json:"egressRequest,omitempty"`
	EgressLimit    *intstr.IntOrString `json:"egressLimit,omitempty"`
}

// ResourceQOSPolicies selects the QoS mechanisms.
type ResourceQOSPolicies struct {
	CPUPolicy    *CPUQOSPolicy `json:"cpuPolicy,omitempty"`
	NETQOSPolicy *NETQOSPolicy `json:"netQOSPolicy,omitempty"`
}

// ResourceQOSStrategy is the QoS of every class.
type ResourceQOSStrategy struct {
	Policies    *ResourceQOSPolicies `json:"policies,omitempty"`
	LSRClass    *ResourceQOS         `json:"lsrClass,omitempty"`
	LSClass     *ResourceQOS         `json:"lsClass,omitempty"`
	BEClass     *ResourceQOS         `json:"beClass,omitempty"`
	SystemClass *ResourceQOS         `json:"systemClass,omitempty"`
	CgroupRoot  *ResourceQOS         `json:"cgroupRoot,omitempty"`
}

// CPUSuppressPolicy is how BE CPU is suppressed.
type CPUSuppressPolicy string

// CPUEvictPolicy is how BE pods are evicted for CPU.
type CPUEvictPolicy string

// ResourceThresholdStrategy is the resource-threshold strategy.
type ResourceThresholdStrategy struct {
	Enable                                 *bool             `json:"enable,omitempty"`
	CPUSuppressThresholdPercent            *int64            `json:"cpuSuppressThresholdPercent,omitempty" validate:"omitempty,min=0,max=100"`
	CPUSuppressMinPercent                  *int64            `json:"cpuSuppressMinPercent,omitempty" validate:"omitempty,min=0,max=100"`
	CPUSuppressPolicy                      CPUSuppressPolicy `json:"cpuSuppressPolicy,omitempty"`
	MemoryEvictThresholdPercent            *int64            `json:"memoryEvictThresholdPercent,omitempty" validate:"omitempty,min=0,max=100,gtfield=MemoryEvictLowerPercent"`
	MemoryEvictLowerPercent                *int64            `json:"memoryEvictLowerPercent,omitempty" validate:"omitempty,min=0,max=100,ltfield=MemoryEvictThresholdPercent"`
	MemoryAllocatableEvictThresholdPercent *int64            `json:"memoryAllocatableEvictThresholdPercent,omitempty" validate:"omitempty,min=0,gtfield=MemoryAllocatableEvictLowerPercent"`
	MemoryAllocatableEvictLowerPercent     *int64            `json:"memoryAllocatableEvictLowerPercent,omitempty" validate:"omitempty,min=0,ltfield=MemoryAllocatableEvictThresholdPercent"`
	CPUEvictBESatisfactionUpperPercent     *int64            `json:"cpuEvictBESatisfactionUpperPercent,omitempty" validate:"omitempty,min=0,max=100,gtfield=CPUEvictBESatisfactionLowerPercent"`
	CPUEvictBESatisfactionLowerPercent     *int64            `json:"cpuEvictBESatisfactionLowerPercent,omitempty" validate:"omitempty,min=0,max=100,ltfield=CPUEvictBESatisfactionUpperPercent"`
	CPUEvictBEUsageThresholdPercent        *int64            `json:"cpuEvictBEUsageThresholdPercent,omitempty" validate:"omitempty,min=0,max=100"`
	CPUEvictTimeWindowSeconds              *int64            `json:"cpuEvictTimeWindowSeconds,omitempty" validate:"omitempty,gt=0"`
	CPUEvictThresholdPercent               *int64            `json:"cpuEvictThresholdPercent,omitempty" validate:"omitempty,min=0,max=100,gtfield=CPUEvictLowerPercent"`
	CPUEvictLowerPercent                   *int64            `json:"cpuEvictLowerPercent,omitempty" validate:"omitempty,min=0,max=100,ltfield=CPUEvictThresholdPercent"`
	CPUAllocatableEvictThresholdPercent    *int64            `json:"cpuAllocatableEvictThresholdPercent,omitempty" validate:"omitempty,min=0,gtfield=CPUAllocatableEvictLowerPercent"`
	CPUAllocatableEvictLowerPercent        *int64            `json:"cpuAllocatableEvictLowerPercent,omitempty" validate:"omitempty,min=0,ltfield=CPUAllocatableEvictThresholdPercent"`
	CPUEvictPolicy                         CPUEvictPolicy    `json:"cpuEvictPolicy,omitempty"`
	EvictEnabledPriorityThreshold          *int32            `json:"evictEnabledPriorityThreshold,omitempty"`
	AllocatableEvictPriorityThreshold      *int32            `json:"allocatableEvictPriorityThreshold,omitempty" validate:"omitempty,min=0,max=7999"`
}

// ResctrlQOSCfg is ResctrlQOS with its switch.
type ResctrlQOSCfg struct {
	Enable     *bool `json:"enable,omitempty"`
	ResctrlQOS `json:",inline"`
}

// ResctrlQOS is a class's LLC and memory-bandwidth share.
type ResctrlQOS struct {
	CATRangeStartPercent *int64 `json:"catRangeStartPercent,omitempty" validate:"omitempty,min=0,max=100,ltfield=CATRangeEndPercent"`
	CATRangeEndPercent   *int64 `json:"catRangeEndPercent,omitempty" validate:"omitempty,min=0,max=100,gtfield=CATRangeStartPercent"`
	MBAPercent           *int64 `json:"mbaPercent,omitempty" validate:"omitempty,min=0,max=100"`
}

// CPUBurstPolicy is the CPU burst mechanism.
type CPUBurstPolicy string

// CPUBurstConfig is the CPU burst setting.
type CPUBurstConfig struct {
	Policy                     CPUBurstPolicy `json:"policy,omitempty"`
	CPUBurstPercent            *int64         `json:"cpuBurstPercent,omitempty" validate:"omitempty,min=1,max=10000"`
	CFSQuotaBurstPercent       *int64         `json:"cfsQuotaBurstPercent,omitempty" validate:"omitempty,min=100"`
	CFSQuotaBurstPeriodSeconds *int64         `json:"cfsQuotaBurstPeriodSeconds,omitempty" validate:"omitempty,min=-1"`
}

// CPUBurstStrategy is the CPU-burst strategy.
type CPUBurstStrategy struct {
	CPUBurstConfig            `json:",inline"`
	SharePoolThresholdPercent *int64 `json:"sharePoolThresholdPercent,omitempty" validate:"omitempty,min=0,max=100"`
}

// SystemStrategy is the system (kernel) strategy.
type SystemStrategy struct {
	MinFreeKbytesFactor       *int64          `json:"minFreeKbytesFactor,omitempty" validate:"omitempty,gt=0"`
	WatermarkScaleFactor      *int64          `json:"watermarkScaleFactor,omitempty" validate:"omitempty,gt=0,max=400"`
	MemcgReapBackGround       *int64          `json:"memcgReapBackGround,omitempty" validate:"omitempty,min=0,max=1"`
	SchedGroupIdentityEnabled *int64          `json:"schedGroupIdentityEnabled,omitempty"`
	SchedIdleSaverWmark       *int64          `json:"schedIdleSaverWmark,omitempty"`
	SchedFeatures             map[string]bool `json:"schedFeatures,omitempty"`
	TotalNetworkBandwidth     Quantity        `json:"totalNetworkBandwidth,omitempty"`
}

// Quantity is resource.Quantity decoded through quantity.ParseJSON: the
// same spellings, with bounded parsing cost.
type Quantity struct {
	resource.Quantity
}

// UnmarshalJSON implements json.Unmarshaler.
func (q *Quantity) UnmarshalJSON(b []byte) error {
	v, err := quantity.ParseJSON(b)
	if err != nil {
		return fmt.Errorf("totalNetworkBandwidth: %w", err)
	}
	q.Quantity = v
	return nil
}
