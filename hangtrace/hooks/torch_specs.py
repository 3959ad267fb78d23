"""What each wrapped torch.distributed function is: its input tensor parameter, peer
parameters, p2p or not, payload kind (data only; used by ``torch_dist``)."""

# name -> (input tensor parameter or None, peer parameter names, is_p2p, payload kind)
# payload kind: "t" tensor, "tl" list of tensors, "o" python object, "ol" object list, None
SPECS = {
    "all_reduce": ("tensor", (), False, "t"),
    "all_gather": ("tensor", (), False, "t"),
    "all_gather_into_tensor": ("input_tensor", (), False, "t"),
    "all_gather_object": ("obj", (), False, "o"),
    "reduce_scatter": ("input_list", (), False, "tl"),
    "reduce_scatter_tensor": ("input", (), False, "t"),
    "all_to_all": ("input_tensor_list", (), False, "tl"),
    "all_to_all_single": ("input", (), False, "t"),
    "broadcast": ("tensor", ("src", "group_src"), False, "t"),
    "broadcast_object_list": ("object_list", ("src", "group_src"), False, "ol"),
    "reduce": ("tensor", ("dst", "group_dst"), False, "t"),
    "gather": ("tensor", ("dst", "group_dst"), False, "t"),
    "gather_object": ("obj", ("dst", "group_dst"), False, "o"),
    "scatter": ("tensor", ("src", "group_src"), False, "t"),
    "scatter_object_list": ("scatter_object_output_list", ("src", "group_src"), False, "ol"),
    "barrier": (None, (), False, None),
    "monitored_barrier": (None, (), False, None),
    "send": ("tensor", ("dst", "group_dst"), True, "t"),
    "recv": ("tensor", ("src", "group_src"), True, "t"),
    "isend": ("tensor", ("dst", "group_dst"), True, "t"),
    "irecv": ("tensor", ("src", "group_src"), True, "t"),
}
GROUP_OPS = ("init_process_group", "new_group", "new_subgroups", "destroy_process_group")
BATCH_OP = "batch_isend_irecv"
