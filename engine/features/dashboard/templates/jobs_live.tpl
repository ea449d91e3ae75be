<div class="scroll">
<table class="jobs">
  <thead><tr>
    <th>job</th><th>type</th><th>status</th><th>queue</th><th>user</th><th>progress</th>
    <th>attempt</th><th>created</th><th>error</th>
  </tr></thead>
  <tbody>
% for job in jobs:
  <tr>
    <td><a href="{{job_url(job.id)}}"><code>{{job.id}}</code></a></td>
    <td>{{job.job_type}}</td>
    <td><span class="badge s-{{job.lifecycle_status}}">{{job.lifecycle_status}}</span></td>
    <td>{{job.queue_name}}</td>
    <td>{{job.user_id}}</td>
    <td><progress max="100" value="{{job.progress}}">{{job.progress}} %</progress></td>
    <td>{{job.attempt_no}}</td>
    <td>{{when(job.created_at)}}</td>
    <td>{{job.error_code or ''}}</td>
  </tr>
% end
% if not jobs:
  <tr><td colspan="9" class="muted">No job matches.</td></tr>
% end
  </tbody>
</table>
</div>
<p class="pages">
% if filters.get('cursor'):
  <a href="{{prefix}}/jobs?{{urlencode(page_query)}}">« First page</a>
% end
% if next_cursor:
  <a href="{{prefix}}/jobs?{{urlencode(dict(page_query, cursor=next_cursor))}}" rel="next">Next page »</a>
% end
</p>
